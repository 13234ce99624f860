"""Model formats load from local artifacts only: shipped names, a .gguf file, a Hugging Face model directory."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tracefleet.formats.families import load_model_format
from tracefleet.formats.models import TEMPLATES, ensure_tokenizer_json, resolve_model

MSGS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi ünïcödé 123"}]


def test_shipped_models_and_their_families():
    smol, gemma = load_model_format("smollm2"), load_model_format("gemma3-270m")
    assert (smol.family.name, gemma.family.name) == ("chatml", "gemma3")
    assert smol.tokenizer.token_text(smol.end_of_turn_id) == "<|im_end|>"
    assert gemma.tokenizer.token_text(gemma.end_of_turn_id) == "<end_of_turn>"
    assert gemma.render(MSGS).startswith("<bos><start_of_turn>user\nBe brief.\n\nhi")
    qwen = load_model_format("smollm2", template_file=TEMPLATES / "qwen3_tools.jinja")
    assert qwen.family.name == "qwen3" and qwen.family.reasoning
    assert qwen.render(MSGS, enable_thinking=False).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert load_model_format("smollm2", family="qwen3", tool_parser="chatml").parser_name == "chatml"
    with pytest.raises(ValueError):
        load_model_format("smollm2", tool_parser="nope")


def test_gguf_file_uses_its_embedded_template():
    path = resolve_model("smollm2").gguf_path
    fmt = load_model_format(str(path))
    assert fmt.family.name == "chatml" and "<|im_start|>" in fmt.template
    assert fmt.encode(fmt.render(MSGS)) == load_model_format("smollm2").encode(load_model_format("smollm2").render(MSGS))


def test_hugging_face_model_directory(tmp_path: Path):
    spec = resolve_model("smollm2")
    tj = ensure_tokenizer_json(spec.gguf_path)
    shutil.copy(tj, tmp_path / "tokenizer.json")
    embedded = json.loads(tj.with_suffix(".meta.json").read_text())["chat_template"]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": {"content": "<|im_start|>"}, "eos_token": "<|im_end|>", "add_bos_token": False,
        "chat_template": embedded}))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    fmt = load_model_format(str(tmp_path))
    assert fmt.name == tmp_path.name and fmt.family.name == "chatml"  # the template decides, not model_type
    assert fmt.tokenizer.eos_token == "<|im_end|>"
    shipped = load_model_format("smollm2")
    assert fmt.encode(fmt.render(MSGS)) == shipped.encode(shipped.render(MSGS))
    # chat_template.jinja wins over tokenizer_config.json's template, as in transformers (and so vLLM)
    (tmp_path / "chat_template.jinja").write_text((TEMPLATES / "chatml_tools.jinja").read_text())
    assert load_model_format(str(tmp_path)).template == (TEMPLATES / "chatml_tools.jinja").read_text()
    (tmp_path / "chat_template.jinja").unlink()
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    with pytest.raises(ValueError, match="no chat template"):
        load_model_format(str(tmp_path))


def test_default_capture_mode_follows_the_template():
    from tracefleet.formats.families import default_capture_mode

    assert default_capture_mode((TEMPLATES / "chatml_tools.jinja").read_text()) == "exact"
    assert default_capture_mode((TEMPLATES / "gemma3_tools.jinja").read_text()) == "exact"
    assert default_capture_mode("{{ messages[0].content }}\n### Response:") == "server"
    assert default_capture_mode(None) == "server"
    assert default_capture_mode("{{ messages[0].content }}", requested="exact") == "exact"
