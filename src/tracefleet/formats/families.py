"""Model families: which output format a model speaks, and everything needed to render for it.

`detect_family` picks the family from (in order) an explicit override (the RolloutJob's
`tool_parser`), the chat template's own markers (the template decides the wire format: SmolLM2 is a
Llama architecture that speaks ChatML), the model config's `model_type`, the GGUF architecture.
`load_model_format` loads tokenizer + template + family from local artifacts only (a shipped model
name, a .gguf file, or a Hugging Face model directory); nothing is downloaded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from tracefleet.formats.chat_template import render_chat
from tracefleet.formats.tokenizer import HFTokenizer


@dataclass(frozen=True)
class Family:
    name: str
    end_of_turn: str  # the text of the token that closes an assistant turn in the template
    reasoning: bool = False
    description: str = ""


FAMILIES: dict[str, Family] = {
    "chatml": Family("chatml", "<|im_end|>", description="ChatML with hermes <tool_call> JSON (SmolLM2, Qwen2.5)"),
    "hermes": Family("hermes", "<|im_end|>", description="alias of chatml"),
    "qwen3": Family("qwen3", "<|im_end|>", True, "ChatML, <think> reasoning, hermes or XML <tool_call>"),
    "qwen3_coder": Family("qwen3_coder", "<|im_end|>", True, "Qwen3-coder / Qwen3.5: XML <function=...> calls"),
    "llama3": Family("llama3", "<|eot_id|>", description="Llama 3.x: JSON tool calls, <|python_tag|>"),
    "gemma3": Family("gemma3", "<end_of_turn>", description="Gemma 3 turns, hermes <tool_call> (shipped template)"),
}

_MODEL_TYPES = {
    "qwen3": "qwen3", "qwen3_moe": "qwen3", "qwen3_next": "qwen3", "qwen3_5": "qwen3_coder",
    "qwen3_5_moe": "qwen3_coder", "qwen2": "chatml", "qwen2_moe": "chatml", "llama": "llama3",
    "gemma3": "gemma3", "gemma3_text": "gemma3",
}


def detect_family(*, template: str | None = None, model_type: str | None = None,
                  architecture: str | None = None, override: str | None = None) -> str:
    if override:
        if override not in FAMILIES:
            raise ValueError(f"unknown model family {override!r}; known: {sorted(FAMILIES)}")
        return override
    t = template or ""
    if "<start_of_turn>" in t:
        return "gemma3"
    if "<|start_header_id|>" in t or "<|eot_id|>" in t:
        return "llama3"
    if "<|im_start|>" in t:
        if "<function=" in t and "<parameter=" in t:
            return "qwen3_coder"
        if "<think>" in t:
            return "qwen3"
        return "chatml"
    for key in (model_type, architecture):
        if key and key.lower() in _MODEL_TYPES:
            return _MODEL_TYPES[key.lower()]
    return "chatml"


def recognised_family(template: str | None) -> str | None:
    """The family the template's own markers identify, or None when exact mode cannot vouch for it."""
    t = template or ""
    if not any(m in t for m in ("<start_of_turn>", "<|start_header_id|>", "<|eot_id|>", "<|im_start|>")):
        return None
    return detect_family(template=t)


def default_capture_mode(template: str | None, requested: str | None = None) -> str:
    """`exact` where the chat template is of a supported family, `server` otherwise; an explicit request wins."""
    if requested in ("exact", "server"):
        return requested
    return "exact" if recognised_family(template) else "server"


@dataclass
class ModelFormat:
    """What exact mode needs to render prompts and parse outputs for one model."""

    name: str
    tokenizer: Any  # tracefleet.formats.tokenizer.Tokenizer
    template: str
    family: Family
    template_vars: dict[str, Any] = field(default_factory=dict)
    tool_parser: str | None = None  # output-parser override (RolloutJob `tool_parser`); None = the family's

    @property
    def parser_name(self) -> str:
        return self.tool_parser or self.family.name

    @cached_property
    def end_of_turn_id(self) -> int | None:
        ids = self.tokenizer.encode(self.family.end_of_turn, add_special_tokens=False)
        return ids[0] if len(ids) == 1 else None

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
               add_generation_prompt: bool = True, **kwargs: Any) -> str:
        return render_chat(self.template, messages, tools=tools, add_generation_prompt=add_generation_prompt,
                           **{**self.template_vars, **kwargs})

    def encode(self, text: str) -> list[int]:
        # a rendered template already holds its BOS text: never add special tokens (vLLM does the same)
        return self.tokenizer.encode(text, add_special_tokens=False)


def load_model_format(ref: str, *, family: str | None = None, template_file: str | Path | None = None,
                      name: str | None = None, tool_parser: str | None = None) -> ModelFormat:
    """`ref`: a shipped model name (`smollm2`, `gemma3-270m`), a .gguf path, or a HF model directory.
    `family` / `tool_parser` override detection (the RolloutJob's `model_family` / `tool_parser`)."""
    from tracefleet.formats.models import MODELS, ensure_tokenizer_json, gguf_metadata, resolve_model, template_source

    model_type = arch = None
    path = model_dir(ref)
    if path is not None:
        tok, template, tvars, model_type = _hf_dir(path)
        served = name or (path.name if Path(ref).expanduser().exists() else ref)
    else:
        spec = resolve_model(ref)
        tok = HFTokenizer(ensure_tokenizer_json(spec.gguf_path), add_bos=spec.add_bos)
        template = template_source(spec, tok.chat_template)
        tvars = spec.template_vars(tok)
        arch = str(gguf_metadata(spec.gguf_path, ("general.architecture",)).get("general.architecture") or "") \
            if ref not in MODELS else None
        served = name or spec.name
    if template_file is not None:
        template = Path(template_file).read_text()
    fam = detect_family(template=template, model_type=model_type, architecture=arch, override=family)
    if tool_parser is not None:
        from tracefleet.formats.parsers import FAMILY_PARSERS

        if tool_parser not in FAMILY_PARSERS:
            raise ValueError(f"unknown tool parser {tool_parser!r}; known: {sorted(FAMILY_PARSERS)}")
    return ModelFormat(served, tok, template, FAMILIES[fam], tvars, tool_parser)


def model_dir(ref: str) -> Path | None:
    """The Hugging Face model directory `ref` names (a path, or a hub id in the local cache), or None
    when it names a shipped model or a .gguf file (`resolve_model` reads those)."""
    from tracefleet.formats.models import MODELS

    path = Path(ref).expanduser()
    if not path.exists() and ref not in MODELS and not ref.endswith(".gguf"):
        path = cached_snapshot(ref)
    return path if path.is_dir() else None


def load_tokenizer(ref: str) -> HFTokenizer:
    """Only the tokenizer of `ref`: anything `load_model_format` takes, or a tokenizer.json file. What a
    reader of traces needs to turn ids into text (no chat template required). Local artifacts only."""
    from tracefleet.formats.models import ensure_tokenizer_json, resolve_model

    path = Path(ref).expanduser()
    if path.is_file() and path.suffix == ".json":
        return HFTokenizer(path, add_bos=False)
    directory = model_dir(ref)
    if directory is not None:
        return _hf_tokenizer(directory)
    spec = resolve_model(ref)
    return HFTokenizer(ensure_tokenizer_json(spec.gguf_path), add_bos=spec.add_bos)


def cached_snapshot(repo_id: str) -> Path:
    """The directory of a hub model already in the local Hugging Face cache (`$HF_HOME/hub`, the layout
    vLLM downloads into): how a proxy sidecar finds the tokenizer in the mounted model cache. Offline."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id, local_files_only=True))
    except (LocalEntryNotFoundError, HFValidationError, OSError) as exc:
        from huggingface_hub.constants import HF_HUB_CACHE

        raise FileNotFoundError(
            f"model {repo_id!r} is not a shipped model ({', '.join(_shipped())}), a .gguf file, a model directory, "
            f"or a hub model in the local cache {HF_HUB_CACHE} ({type(exc).__name__})") from None


def _shipped() -> list[str]:
    from tracefleet.formats.models import MODELS

    return sorted(MODELS)


def _tokenizer_config(path: Path) -> dict[str, Any]:
    return json.loads((path / "tokenizer_config.json").read_text()) if (path / "tokenizer_config.json").is_file() else {}


def _hf_tokenizer(path: Path) -> HFTokenizer:
    """The tokenizer of a Hugging Face model directory (tokenizer.json, BOS/EOS from tokenizer_config.json)."""
    tj = path / "tokenizer.json"
    if not tj.is_file():
        raise FileNotFoundError(f"{path} has no tokenizer.json")
    cfg = _tokenizer_config(path)
    tok = HFTokenizer(tj, add_bos=bool(cfg.get("add_bos_token", False)))

    def token(v: Any) -> str:
        return (v.get("content") if isinstance(v, dict) else v) or ""

    tok.bos_token, tok.eos_token = token(cfg.get("bos_token")), token(cfg.get("eos_token"))
    return tok


def _hf_dir(path: Path) -> tuple[Any, str, dict[str, Any], str | None]:
    tok = _hf_tokenizer(path)
    cfg = _tokenizer_config(path)
    # chat_template.jinja wins over tokenizer_config.json's chat_template, as in transformers (and so vLLM)
    jinja = path / "chat_template.jinja"
    template = jinja.read_text() if jinja.is_file() else cfg.get("chat_template")
    if isinstance(template, list):  # named templates: the default one
        template = next((t["template"] for t in template if t.get("name") == "default"), template[0]["template"])
    if not template:
        raise ValueError(f"{path} has no chat template (tokenizer_config.json or chat_template.jinja)")
    config = json.loads((path / "config.json").read_text()) if (path / "config.json").is_file() else {}
    return tok, template, {"bos_token": tok.bos_token, "eos_token": tok.eos_token}, config.get("model_type")
