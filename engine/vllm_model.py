"""Turn a shipped GGUF model into a Hugging Face model directory that vLLM's CPU build can serve.

Run by hack/setup.d/45-vllm.sh with the vLLM venv's Python (it needs torch, transformers and gguf, which
that venv has and the project's does not promise), as a plain script: it imports nothing from tracefleet.

vLLM cannot load the GGUF directly, and transformers refuses to `save_pretrained` a model it loaded with
`gguf_file=` (it is marked quantized). So: load the GGUF (transformers dequantizes it), rebuild a plain
model of the same architecture from the config, load the dequantized weights, tie the embeddings and save
safetensors. The tokenizer is the project's converted `tokenizer.json` (the proxy's exact mode tokenizes
with the very same file) and the chat template is the one the project serves the model with, so vLLM's
renderer and the proxy's render the same text. `generation_config.json` names every token that ends a turn
(`--stop-token`, e.g. Gemma 3's `<end_of_turn>` beside `<eos>`): vLLM stops on the tokenizer's EOS plus that
list, and a base model's GGUF names only `<eos>`, so without it Gemma would run past its turn to max_tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path


def convert(gguf: Path, tokenizer_json: Path, template: Path, out: Path, max_model_len: int,
            stop_tokens: list[str] | None = None) -> None:
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig, PreTrainedTokenizerFast

    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    config_dict = {k: v for k, v in loaded.config.to_dict().items() if k != "quantization_config"}
    config = AutoConfig.for_model(**config_dict)
    if (config.max_position_embeddings or 0) < max_model_len:
        raise SystemExit(f"{gguf.name} was trained for {config.max_position_embeddings} positions, not {max_model_len}")
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(loaded.state_dict(), strict=False)
    if config.tie_word_embeddings:
        plain.tie_weights()
        missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise SystemExit(f"weights do not fit the rebuilt model: missing {missing}, unexpected {unexpected}")

    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    plain.save_pretrained(str(tmp), safe_serialization=True)
    meta_file = tokenizer_json.with_suffix(".meta.json")
    meta = json.loads(meta_file.read_text()) if meta_file.is_file() else {}
    tok = PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_json), bos_token=meta.get("bos_token"),
                                  eos_token=meta.get("eos_token"), clean_up_tokenization_spaces=False,
                                  model_max_length=max_model_len)
    tok.chat_template = template.read_text()
    tok.save_pretrained(str(tmp))
    # Only the token ids: no sampling defaults, so vLLM samples as the request says (T=1 when omitted).
    eos_ids = [tok.eos_token_id]
    for text in stop_tokens or ():
        token_id = tok.convert_tokens_to_ids(text)
        if token_id is None or token_id == tok.unk_token_id:
            raise SystemExit(f"stop token {text!r} is not in {tokenizer_json.name}'s vocabulary")
        if token_id not in eos_ids:
            eos_ids.append(token_id)
    GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=eos_ids[0] if len(eos_ids) == 1 else eos_ids,
                     pad_token_id=tok.eos_token_id).save_pretrained(str(tmp))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gguf", type=Path, required=True)
    p.add_argument("--tokenizer-json", type=Path, required=True)
    p.add_argument("--template", type=Path, required=True)
    p.add_argument("--max-model-len", type=int, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--stop-token", action="append", default=[], metavar="TEXT",
                   help="a token that ends an assistant turn besides EOS (repeatable)")
    a = p.parse_args(argv)
    convert(a.gguf, a.tokenizer_json, a.template, a.out, a.max_model_len, a.stop_token)
    print(f"converted {a.gguf.name} -> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
