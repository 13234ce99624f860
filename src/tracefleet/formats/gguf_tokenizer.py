"""A GGUF file's vocabulary as a Hugging Face `tokenizers` file (what `models.ensure_tokenizer_json` caches).

`converted_tokenizer(gguf_path)` picks the converter. Byte-level BPE vocabularies (GGUF
`tokenizer.ggml.model == "gpt2"`) whose pre-tokenizer tracefleet pins in `PRE_TOKENIZERS` (SmolLM2, the
quickstart's model) are built here from the file's metadata with `gguf` (numpy) and `tokenizers` alone:
transformers' GGUF reader imports torch even for the vocabulary, a 4 GB install the quickstart door does
not otherwise need. Every other vocabulary (Gemma 3's SentencePiece-style `llama` model) goes through
transformers. Both give the same `ConvertedTokenizer`; for SmolLM2 the two are JSON-equal
(tests/engine/test_engine_gguf_tokenizer.py checks it, and that llama.cpp tokenizes alike).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from tracefleet.formats.gguf import gguf_metadata

# transformers' GGUF converter drops the digit split that SmolLM2 (and llama.cpp) apply first, so "a  1"
# would tokenize differently from the model's own tokenizer: keyed by GGUF `tokenizer.ggml.pre`.
PRE_TOKENIZERS = {
    "smollm": {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]},
}

# llama.cpp's token types (GGUF `tokenizer.ggml.token_type`)
TOKEN_TYPE_CONTROL = 3

_VOCAB_KEYS = ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.merges",
               "tokenizer.ggml.token_type", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
               "tokenizer.chat_template")


@dataclass(frozen=True)
class ConvertedTokenizer:
    tokenizer: dict  # the tokenizer.json document
    meta: dict  # bos_token, eos_token, chat_template: what the .meta.json beside it holds


def converted_tokenizer(gguf_path: Path) -> ConvertedTokenizer:
    """The vocabulary of `gguf_path` converted, without torch where `byte_level_tokenizer` handles it."""
    meta = gguf_metadata(gguf_path, _VOCAB_KEYS)
    if meta.get("tokenizer.ggml.model") == "gpt2" and meta.get("tokenizer.ggml.pre") in PRE_TOKENIZERS:
        return byte_level_tokenizer(meta)
    return transformers_tokenizer(gguf_path, meta.get("tokenizer.ggml.pre"))


@cache
def byte_alphabet() -> dict[int, str]:
    """GPT-2's reversible spelling of bytes as printable characters, the alphabet byte-level BPE vocabularies
    are written in: printable Latin-1 bytes stand for themselves, the others for 256, 257, ... in byte order."""
    printable = {*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    spelled: dict[int, str] = {}
    stand_ins = 0
    for byte in range(256):
        if byte in printable:
            spelled[byte] = chr(byte)
        else:
            spelled[byte] = chr(256 + stand_ins)
            stand_ins += 1
    return spelled


def byte_level_tokenizer(meta: dict[str, object]) -> ConvertedTokenizer:
    """A byte-level BPE vocabulary (GGUF metadata `meta`) built as transformers' GGUF converter builds it:
    tokens outside the byte alphabet respelled byte by byte, the file's merges, control tokens added as
    special tokens, a ByteLevel decoder and a pass-through post-processor; then the pinned pre-tokenizer."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    tokens: list[str] = list(meta["tokenizer.ggml.tokens"])  # type: ignore[arg-type]
    types = list(meta.get("tokenizer.ggml.token_type") or ())  # type: ignore[call-overload]
    spelling = byte_alphabet()
    alphabet = set(spelling.values())
    vocab = {tok if set(tok) <= alphabet else "".join(spelling[b] for b in tok.encode()): i
             for i, tok in enumerate(tokens)}
    merges = [tuple(m.split(" ")) for m in meta.get("tokenizer.ggml.merges") or ()]  # type: ignore[union-attr]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, continuing_subword_prefix="", end_of_word_suffix="",
                               fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(single="$A:0", pair="$A:0 $B:1", special_tokens=[])
    # A control token spelled outside the byte alphabet is a llama.cpp mislabel; transformers skips it too.
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t, kind in zip(tokens, types)
                            if kind == TOKEN_TYPE_CONTROL and set(t) <= alphabet])
    data = json.loads(tok.to_str())
    data["pre_tokenizer"] = PRE_TOKENIZERS[meta["tokenizer.ggml.pre"]]  # type: ignore[index]

    def token(key: str) -> str | None:
        index = meta.get(key)
        return tokens[index] if isinstance(index, int) and 0 <= index < len(tokens) else None

    return ConvertedTokenizer(data, {"bos_token": token("tokenizer.ggml.bos_token_id"),
                                     "eos_token": token("tokenizer.ggml.eos_token_id"),
                                     "chat_template": meta.get("tokenizer.chat_template")})


def transformers_tokenizer(gguf_path: Path, pre: object = None) -> ConvertedTokenizer:
    """Any vocabulary transformers' GGUF reader knows (it imports torch), with the pinned pre-tokenizer."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    backend = getattr(tok, "backend_tokenizer", None) or tok._tokenizer
    data = json.loads(backend.to_str())
    if pre in PRE_TOKENIZERS:
        data["pre_tokenizer"] = PRE_TOKENIZERS[pre]  # type: ignore[index]
    return ConvertedTokenizer(data, {"bos_token": tok.bos_token, "eos_token": tok.eos_token,
                                     "chat_template": getattr(tok, "chat_template", None)})
