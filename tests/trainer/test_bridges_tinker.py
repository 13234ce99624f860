"""The Tinker API bridge on a sealed batch of real harness sessions (fixtures.bridge_batches): each trace a
`tinker.types.Datum` of the real `tinker` package, shifted by one token, the logprobs and advantages 0.0 wherever
the target was not sampled, nothing but the three keys `importance_sampling`/`ppo` take, and what the client puts
on the wire (its own pydantic conversion) accepted; a LoRA adapter merged into base weights as W + alpha/r B A."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from tracefleet.trainer.bridges import tinker as bridge

from fixtures.bridge_batches import TRAINED, close, expected_advantages, expected_response, harness_of, sealed_batch


@pytest.fixture(scope="module")
def batch(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return sealed_batch(tmp_path_factory.mktemp("tinker"))


def test_datums_are_the_traces_shifted_by_one_token(batch: Any) -> None:
    from tinker import types
    from tinker.lib._pydantic_conv import to_pydantic_input

    data = bridge.datums(batch)
    advantages = expected_advantages()
    assert len(data) == len(TRAINED)
    for d, session in zip(data, TRAINED, strict=True):
        assert isinstance(d, types.Datum) and tuple(d.loss_fn_inputs) == bridge.LOSS_INPUT_KEYS
        prompt, response, mask, logprobs = expected_response(harness_of(session))
        tokens, sampled = prompt + response, [0] * len(prompt) + mask
        lps = [0.0] * len(prompt) + logprobs
        assert d.model_input.to_ints() == tokens[:-1]
        inputs = {k: v.tolist() for k, v in d.loss_fn_inputs.items()}
        assert inputs["target_tokens"] == tokens[1:]
        assert close(inputs["logprobs"], lps[1:])
        assert close(inputs["advantages"], [advantages[session] * m for m in sampled[1:]])
        assert {k: v.dtype for k, v in d.loss_fn_inputs.items()} == {
            "target_tokens": "int64", "logprobs": "float32", "advantages": "float32"}
    wire = to_pydantic_input(types.ForwardBackwardInput(data=data, loss_fn="importance_sampling")).model_dump(mode="json")
    assert [set(d["loss_fn_inputs"]) for d in wire["data"]] == [set(bridge.LOSS_INPUT_KEYS)] * len(data)  # what the client sends


def test_a_lora_adapter_is_merged_into_the_base_weights(tmp_path: Path) -> None:
    torch.manual_seed(0)
    base = {"model.layers.0.self_attn.q_proj.weight": torch.randn(8, 6), "model.norm.weight": torch.ones(6)}
    (tmp_path / "base").mkdir()
    save_file(base, str(tmp_path / "base" / "model.safetensors"))
    a, b = torch.randn(2, 6), torch.randn(8, 2)
    adapter = {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": a,
               "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": b}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in ((bridge.ADAPTER_CONFIG, json.dumps({"r": 2, "lora_alpha": 8}).encode()),
                           (bridge.ADAPTER_WEIGHTS, _safetensors_bytes(adapter, tmp_path))):
            info = tarfile.TarInfo(f"sampler_weights/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    out = bridge.checkpoint_from_archive(buffer.getvalue(), tmp_path / "base", tmp_path / "merged")
    merged = load_file(str(out / "model.safetensors"))
    assert set(merged) == {"model.layers.0.self_attn.q_proj.weight"}  # the reload keeps the rest
    torch.testing.assert_close(merged["model.layers.0.self_attn.q_proj.weight"],
                               base["model.layers.0.self_attn.q_proj.weight"] + 4.0 * (b @ a))


def test_a_sharded_base_is_merged_and_adapters_it_cannot_merge_are_refused(tmp_path: Path) -> None:
    torch.manual_seed(0)
    q, o = "model.layers.0.self_attn.q_proj.weight", "model.layers.1.self_attn.o_proj.weight"
    base = {q: torch.randn(8, 6), o: torch.randn(6, 6), "model.embed_tokens.weight": torch.randn(10, 6)}
    (tmp_path / "base").mkdir()
    shards = {"model-00001-of-00002.safetensors": [q, "model.embed_tokens.weight"], "model-00002-of-00002.safetensors": [o]}
    for shard, names in shards.items():  # as Hugging Face writes a checkpoint too large for one file
        save_file({n: base[n] for n in names}, str(tmp_path / "base" / shard))
    (tmp_path / "base" / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {n: shard for shard, names in shards.items() for n in names}}))
    a, b = torch.randn(2, 6), torch.randn(6, 2)
    adapter = {f"base_model.model.{o[:-7]}.lora_A.weight": a, f"base_model.model.{o[:-7]}.lora_B.weight": b}
    merged = bridge.merge_lora(adapter, {"r": 2, "lora_alpha": 2}, tmp_path / "base")
    assert set(merged) == {o}
    torch.testing.assert_close(merged[o], base[o] + b @ a)

    # never silently dropped: a DoRA magnitude, an embedding's adapter, a head the tied embedding stands for
    for extra, words in (({f"base_model.model.{o[:-7]}.lora_magnitude_vector": torch.ones(6)}, "not a Linear layer's"),
                         ({"base_model.model.model.embed_tokens.lora_A.weight": a,
                           "base_model.model.model.embed_tokens.lora_B.weight": b}, "not a Linear layer's"),
                         ({"base_model.model.lm_head.lora_A.weight": a, "base_model.model.lm_head.lora_B.weight": torch.randn(10, 2)},
                          "ties its embeddings")):
        with pytest.raises(ValueError, match=words) as err:
            bridge.merge_lora({**adapter, **extra}, {"r": 2, "lora_alpha": 2}, tmp_path / "base")
        assert "train_unembed=False" in str(err.value) and "\n" not in str(err.value)


def _safetensors_bytes(tensors: dict[str, torch.Tensor], tmp: Path) -> bytes:
    save_file(tensors, str(tmp / "adapter.safetensors"))
    return (tmp / "adapter.safetensors").read_bytes()


def test_checkpoint_paths_of_both_servers() -> None:
    assert bridge.checkpoint_ids("tinker://run-1/sampler_weights/policy-3") == ("run-1", "policy-3")
    assert bridge.checkpoint_ids("tinker://model_8c72be51/policy-1") == ("model_8c72be51", "policy-1")  # SkyRL
    with pytest.raises(ValueError, match="not a tinker checkpoint path"):
        bridge.checkpoint_ids("s3://bucket/policy-1")
