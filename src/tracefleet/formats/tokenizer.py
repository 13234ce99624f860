"""Tokenizers built from model artifacts (shared by the engine backends and the proxy's exact mode).

`HFTokenizer` wraps a Hugging Face `tokenizers` file converted from the GGUF vocabulary (what vLLM
would use); `LlamaTokenizer` wraps llama.cpp's own. Both speak the small `Tokenizer` protocol, and
`IncrementalDetokenizer` turns a growing list of ids into text deltas without splitting a UTF-8
character across two deltas.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol


class Tokenizer(Protocol):
    bos_token: str
    eos_token: str
    bos_token_id: int | None
    eos_token_ids: frozenset[int]
    vocab_size: int

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]: ...

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...

    def token_text(self, token_id: int) -> str: ...

    def is_special(self, token_id: int) -> bool: ...


class HFTokenizer:
    def __init__(self, tokenizer_json: Path, *, add_bos: bool) -> None:
        from tokenizers import Tokenizer as _T

        self._tok = _T.from_file(str(tokenizer_json))
        self._tok.no_padding()
        self._tok.no_truncation()
        meta_path = tokenizer_json.with_suffix(".meta.json")
        meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
        self.bos_token = meta.get("bos_token") or ""
        self.eos_token = meta.get("eos_token") or ""
        self.chat_template: str | None = meta.get("chat_template")
        self.bos_token_id = self._tok.token_to_id(self.bos_token) if self.bos_token else None
        self.eos_token_ids = frozenset(i for i in [self._tok.token_to_id(self.eos_token)] if i is not None)
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self._add_bos = add_bos
        self._special = {t.content: i for i, t in self._tok.get_added_tokens_decoder().items() if t.special} \
            if hasattr(self._tok, "get_added_tokens_decoder") else {}
        self._special_ids = frozenset(self._special.values())

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        # The converted post-processor is not trusted for BOS: the GGUF's add_bos flag decides.
        ids = self._tok.encode(text, add_special_tokens=False).ids
        if add_special_tokens and self._add_bos and self.bos_token_id is not None:
            ids = [self.bos_token_id] + ids
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_text(self, token_id: int) -> str:
        return self._tok.decode([token_id], skip_special_tokens=False)

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special_ids


class IncrementalDetokenizer:
    """Text deltas for a growing id list (vLLM's prefix/read offset scheme)."""

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True) -> None:
        self.tok = tokenizer
        self.skip = skip_special_tokens
        self.ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0
        self.text = ""

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        prefix = self.tok.decode(self.ids[self.prefix_offset:self.read_offset], self.skip)
        full = self.tok.decode(self.ids[self.prefix_offset:], self.skip)
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            delta = full[len(prefix):]
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
            self.text += delta
            return delta
        return ""

    def flush(self) -> str:
        """Whatever is still held back at the end (a trailing partial character)."""
        full = self.tok.decode(self.ids[self.prefix_offset:], self.skip)
        prefix = self.tok.decode(self.ids[self.prefix_offset:self.read_offset], self.skip)
        delta = full[len(prefix):] if full.startswith(prefix) else ""
        self.read_offset = len(self.ids)
        self.prefix_offset = self.read_offset
        self.text += delta
        return delta
