"""The Tinker API (Thinking Machines' service, SkyRL's `skyrl.tinker.api`, and the trainers that speak it): a
batch as `tinker.types.Datum`s, and a loop that trains on a job's batches through any Tinker-API server and
puts each step's weights into the job's engine(s).

A Datum is one trace shifted by one token, as the API's losses read it (the cookbook's form):
`model_input` = tokens[:-1], `loss_fn_inputs` = `target_tokens` tokens[1:], `logprobs` (the engine's logprob of
each target the policy sampled), `advantages` (the session's group advantage on those targets); both 0.0 where
the target is context (prompt, tool results, harness text). Those three keys are what `importance_sampling` and
`ppo` take, and no other: a server rejects keys its loss does not know.

After each `forward_backward` + `optim_step` the loop saves the sampler weights, downloads their archive and,
where they are a LoRA adapter (PEFT's layout: `adapter_config.json`, `adapter_model.safetensors`), merges it into
the base weights (W + alpha/r B A) and writes the merged tensors as a checkpoint vLLM's in-place reload reads;
full weights go as they are. `update_policy` then labels the engines with the step's version.
"""

from __future__ import annotations

import io
import json
import re
import tarfile
from pathlib import Path
from typing import Any

from tracefleet.trainer.bridges.rows import Rollout, trained_rollouts

LOSS_INPUT_KEYS = ("target_tokens", "logprobs", "advantages")
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def datum(r: Rollout) -> Any:
    """One trace as a tinker Datum (module docstring)."""
    from tinker import types

    sampled = r.loss_mask[1:]
    return types.Datum(
        model_input=types.ModelInput.from_ints(r.tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": types.TensorData(data=r.tokens[1:], dtype="int64", shape=[len(r.tokens) - 1]),
            "logprobs": types.TensorData(data=[lp if m else 0.0 for lp, m in zip(r.logprobs[1:], sampled)],
                                         dtype="float32", shape=[len(sampled)]),
            "advantages": types.TensorData(data=[r.advantage if m else 0.0 for m in sampled], dtype="float32",
                                           shape=[len(sampled)]),
        },
    )


def datums(batch: Any, **options: Any) -> list[Any]:
    """The batch's trainable traces, groups of fewer than two sessions left out, as Datums, one per
    `rows.trained_rollouts(batch)` in its order (a Datum has no room for the session id). `options`:
    rows.rollouts' (max_lag...)."""
    return [datum(r) for r in trained_rollouts(batch, **options)]


def train_step(training_client: Any, data: list[Any], *, loss_fn: str = "importance_sampling",
               learning_rate: float = 1e-5) -> dict[str, Any]:
    """One forward_backward over `data` and one optim_step; the server's metrics and its logprobs of every
    target (one list per datum)."""
    from tinker import types

    fb = training_client.forward_backward(data, loss_fn).result()
    training_client.optim_step(types.AdamParams(learning_rate=learning_rate)).result()
    logprobs = [out["logprobs"].tolist() for out in fb.loss_fn_outputs]
    return {"datums": len(data), "metrics": dict(fb.metrics), "logprobs": logprobs}


# PEFT's names of a Linear's adapter pair (an optional adapter name between, as PEFT writes `.default.`)
LORA_KEY = re.compile(r"(?:base_model\.model\.)?(?P<module>.+)\.(?P<part>lora_A|lora_B)(?:\.[\w-]+)?\.weight")
SAFETENSORS_INDEX = "model.safetensors.index.json"


def training_client(service_client: Any, base_model: str, *, rank: int = 16, **options: Any) -> Any:
    """A LoRA training client whose adapters `merge_lora` merges: `train_unembed=False` unless asked (the client's
    default is True; an unembedding adapter on a tied-embedding model has no weight of its own to merge into, the head
    being the embedding, and an embedding adapter is not a Linear's W + B A). `options`: the client's own."""
    options.setdefault("train_unembed", False)
    return service_client.create_lora_training_client(base_model=base_model, rank=rank, **options)


def base_weight_files(base_dir: Path) -> dict[str, Path]:
    """Each tensor of a Hugging Face checkpoint directory -> the safetensors file holding it: one
    `model.safetensors`, or the shards its `model.safetensors.index.json` maps (any `*.safetensors` without one)."""
    from safetensors import safe_open

    index = base_dir / SAFETENSORS_INDEX
    if index.is_file():
        return {name: base_dir / shard for name, shard in json.loads(index.read_text())["weight_map"].items()}
    files: dict[str, Path] = {}
    for path in sorted(base_dir.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            files.update(dict.fromkeys(f.keys(), path))
    if not files:
        raise ValueError(f"{base_dir}: no safetensors weights (model.safetensors or shards with {SAFETENSORS_INDEX})")
    return files


def merge_lora(adapter: dict[str, Any], config: dict[str, Any], base_dir: Path) -> dict[str, Any]:
    """The base tensors an adapter changes, merged: W + (lora_alpha / r) B A, named as in the base checkpoint (one
    file or shards). `adapter`: PEFT's tensors of Linear layers (`base_model.model.<name>.lora_A.weight` / `lora_B`);
    any other tensor (an embedding's adapter, DoRA magnitudes, modules saved whole) is refused, never dropped."""
    from safetensors import safe_open

    scale = float(config["lora_alpha"]) / float(config["r"])
    pairs: dict[str, dict[str, Any]] = {}
    unknown = []
    for key, tensor in adapter.items():
        m = LORA_KEY.fullmatch(key)
        if m is None or "embed_tokens" in m["module"]:
            unknown.append(key)
            continue
        pairs.setdefault(m["module"] + ".weight", {})[m["part"]] = tensor
    if unknown:
        raise ValueError(f"the adapter holds {len(unknown)} tensor(s) that are not a Linear layer's lora_A/lora_B pair "
                         f"and cannot be merged ({', '.join(sorted(unknown)[:3])}{', ...' if len(unknown) > 3 else ''}): "
                         "train attention and MLP layers only (training_client: train_unembed=False)")
    files = base_weight_files(base_dir)
    merged = {}
    for name, pair in sorted(pairs.items()):
        if name not in files:
            tied = name.startswith("lm_head") and "model.embed_tokens.weight" in files
            raise ValueError(f"adapter tensor {name} has no base weight in {base_dir}"
                             + (": the model ties its embeddings, so the head has no weight of its own; train with "
                                "train_unembed=False (training_client)" if tied else ""))
        if set(pair) != {"lora_A", "lora_B"}:
            raise ValueError(f"adapter tensor {name} lacks one of lora_A/lora_B")
        with safe_open(str(files[name]), framework="pt") as base:
            w = base.get_tensor(name)
        merged[name] = (w.float() + scale * (pair["lora_B"].float() @ pair["lora_A"].float())).to(w.dtype).contiguous()
    return merged


def checkpoint_from_archive(archive: bytes, base_dir: Path, out: Path) -> Path:
    """A checkpoint directory for the engine from a sampler-weights archive (a tar): the LoRA merged into
    `base_dir`'s weights, or the full weights as they are."""
    from safetensors.torch import load, save_file

    files: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        for member in tar.getmembers():
            if member.isfile():
                files[Path(member.name).name] = tar.extractfile(member).read()  # type: ignore[union-attr]
    out.mkdir(parents=True, exist_ok=True)
    if ADAPTER_CONFIG in files and ADAPTER_WEIGHTS in files:
        merged = merge_lora(load(files[ADAPTER_WEIGHTS]), json.loads(files[ADAPTER_CONFIG]), base_dir)
        save_file(merged, str(out / "model.safetensors"), metadata={"format": "pt"})
        return out
    weights = [n for n in files if n.endswith(".safetensors")]
    if not weights:
        raise ValueError(f"the sampler weights archive holds neither a LoRA adapter nor safetensors: {sorted(files)}")
    for name in weights:
        (out / name).write_bytes(files[name])
    return out


def checkpoint_ids(tinker_path: str) -> tuple[str, str]:
    """(training run id, checkpoint id) of a sampler-weights path: `tinker://RUN/sampler_weights/ID` as Thinking
    Machines writes it, `tinker://RUN/ID` as SkyRL does (the client's own parser takes only the first)."""
    parts = tinker_path.removeprefix("tinker://").split("/")
    if not tinker_path.startswith("tinker://") or len(parts) < 2 or not all(parts):
        raise ValueError(f"not a tinker checkpoint path: {tinker_path}")
    return parts[0], parts[-1]


def export_weights(service_client: Any, training_client: Any, name: str, base_dir: Path, out: Path) -> Path:
    """The training client's current weights as a checkpoint directory the engine reads (checkpoint_from_archive)."""
    import httpx

    saved = training_client.save_weights_for_sampler(name).result()
    run, checkpoint = checkpoint_ids(saved.path)
    url = service_client.create_rest_client().get_checkpoint_archive_url(run, checkpoint).result().url
    response = httpx.get(url, timeout=600, follow_redirects=True).raise_for_status()
    return checkpoint_from_archive(response.content, base_dir, out)


def train(service_client: Any, training_client: Any, reader: Any, engines: list[str], base_dir: str | Path,
          out: str | Path, *, loss_fn: str = "importance_sampling", learning_rate: float = 1e-5,
          steps: int | None = None, start_version: int | None = None, follow_options: dict[str, Any] | None = None,
          **options: Any) -> list[dict[str, Any]]:
    """Follow the job's batches: a train_step per batch with data, its weights into the engines as the next
    version (after `start_version`; None: the engines' own, control.engine_version), the batch committed. One
    record per step."""
    from tracefleet.trainer.control import engine_version, update_policy

    version, log = engine_version(engines) if start_version is None else start_version, []
    for batch in reader.follow(**(follow_options or {})):
        data = datums(batch, **options)
        if data:
            record = {"seq": batch.seq, **train_step(training_client, data, loss_fn=loss_fn, learning_rate=learning_rate)}
            version += 1
            weights = export_weights(service_client, training_client, f"policy-{version}", Path(base_dir),
                                     Path(out) / f"policy-{version}")
            record["sync_s"] = update_policy(engines, weights, version).seconds
            record["version"] = version
            log.append(record)
        if reader.consumer is not None:
            reader.commit(batch)
        if steps is not None and len(log) >= steps:
            break
    return log
