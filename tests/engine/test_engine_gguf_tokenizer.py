"""SmolLM2's vocabulary converted without torch (formats/gguf_tokenizer.py) is the tokenizer transformers'
GGUF converter builds (plus tracefleet's pinned pre-tokenizer), and tokenizes as llama.cpp does; the
quickstart door's conversion never imports torch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tokenizers import Tokenizer

from tracefleet.formats.chat_template import render_chat
from tracefleet.formats.gguf_tokenizer import (
    ConvertedTokenizer, converted_tokenizer, transformers_tokenizer,
)
from tracefleet.formats.models import gguf_metadata, resolve_model, tokenizer_json_path

from fixtures.scripts import script_module

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "examples" / "quickstart"


def quickstart_system() -> str:
    return script_module(QUICKSTART / "agent.py", "quickstart_agent").SYSTEM


def corpus(chat_template: str, shipped_template: str) -> list[str]:
    prompts = [t["prompt"] for t in yaml.safe_load((QUICKSTART / "job.yaml").read_text())["spec"]["tasks"]["inline"]]
    chat = [{"role": "system", "content": quickstart_system()}, {"role": "user", "content": prompts[0]},
            {"role": "assistant", "content": "```python\ndef add(a, b):\n    return a + b\n```"}]
    return [
        *prompts,
        render_chat(chat_template, chat, add_generation_prompt=True),
        render_chat(shipped_template, chat[:2], add_generation_prompt=True),
        "def f(x):\n\treturn {'k': [1, 2.5e-3, 0x1F]}  # comment\n\n\nclass A(B): pass",
        "1234567890 12,345.67 3.14159 2026-11-24T07:36:41Z v0.3.16 -42 1e10",
        "héllo wörld ünïcödé 世界 こんにちは Привет 🙂👍🏽 مرحبا ﬁ \u200b\u00a0nbsp",
        "a  b   c    d\t\te\n\n\nf \n \n g      ",
        "   leading and trailing   ",
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<|endoftext|><repo_name>x<file_sep>",
        "<|im_start|not special <|im_end |> <im_start>",
        "don't I'll we've they're it's IT'S",
        "~!@#$%^&*()_+`-=[]\\{}|;':\",./<>?",
        "",
        " ",
        "\n",
    ]


@pytest.fixture(scope="module")
def smollm2() -> tuple[Path, ConvertedTokenizer, ConvertedTokenizer]:
    path = resolve_model("smollm2").gguf_path
    pre = gguf_metadata(path, ("tokenizer.ggml.pre",))["tokenizer.ggml.pre"]
    return path, converted_tokenizer(path), transformers_tokenizer(path, pre)


def test_smollm2_converts_without_transformers_to_the_same_file(smollm2):
    path, ours, reference = smollm2
    assert gguf_metadata(path, ("tokenizer.ggml.model",))["tokenizer.ggml.model"] == "gpt2"
    assert ours.tokenizer == reference.tokenizer  # JSON-equal: vocabulary, merges, added tokens, pipeline
    assert ours.meta == reference.meta
    assert ours.meta["bos_token"] == "<|im_start|>" and ours.meta["eos_token"] == "<|im_end|>"
    assert "<|im_start|>" in ours.meta["chat_template"]


def test_smollm2_ids_match_transformers_and_llama_cpp(smollm2):
    from llama_cpp import Llama

    from tracefleet.formats.models import TEMPLATES

    path, ours, reference = smollm2
    mine, theirs = (Tokenizer.from_str(json.dumps(c.tokenizer)) for c in (ours, reference))
    llm = Llama(model_path=str(path), vocab_only=True, verbose=False)
    texts = corpus(ours.meta["chat_template"], (TEMPLATES / "chatml_tools.jinja").read_text())
    for text in texts:
        ids = mine.encode(text, add_special_tokens=False).ids
        assert ids == theirs.encode(text, add_special_tokens=False).ids, text
        assert ids == llm.tokenize(text.encode(), add_bos=False, special=True), text
        assert mine.decode(ids, skip_special_tokens=False) == theirs.decode(ids, skip_special_tokens=False) == text
        assert mine.decode(ids) == theirs.decode(ids)
    special = mine.encode("<|im_start|>user\nhi<|im_end|>", add_special_tokens=False).ids
    assert special[0] == 1 and special[-1] == 2


def test_vocabularies_without_a_pinned_pre_tokenizer_go_through_transformers(smollm2, monkeypatch):
    from tracefleet.formats import gguf_tokenizer

    path, _, reference = smollm2
    meta = gguf_metadata(path, gguf_tokenizer._VOCAB_KEYS)
    called = []
    monkeypatch.setattr(gguf_tokenizer, "gguf_metadata", lambda p, keys: {**meta, "tokenizer.ggml.pre": "gpt-2"})
    monkeypatch.setattr(gguf_tokenizer, "transformers_tokenizer", lambda p, pre: called.append(pre) or reference)
    assert converted_tokenizer(path) is reference and called == ["gpt-2"]


def test_quickstart_conversion_imports_no_torch(tmp_path: Path, monkeypatch):
    """What 40-engine.sh runs in the quickstart door, in a fresh cache: neither torch nor transformers loads."""
    code = ("import sys; from tracefleet.formats.models import main; main(['--ensure', 'smollm2']); "
            "loaded = sorted({'torch', 'transformers'} & set(sys.modules)); sys.exit(f'imported {loaded}' if loaded else 0)")
    monkeypatch.setenv("TRACEFLEET_CACHE", str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    target = tokenizer_json_path(resolve_model("smollm2").gguf_path)
    assert target.is_relative_to(tmp_path)
    assert json.loads(target.read_text())["pre_tokenizer"]["pretokenizers"][0]["type"] == "Digits"
    assert json.loads(target.with_suffix(".meta.json").read_text())["eos_token"] == "<|im_end|>"
