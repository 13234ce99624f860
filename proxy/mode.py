"""Which capture mode a proxy runs in, and why.

`auto` (the RolloutJob default) runs exact where the proxy can read the model's tokenizer and its chat
template belongs to a family whose output we parse, and server otherwise: a job on an unsupported model
still runs, with drift, instead of failing. `exact` asked for explicitly fails closed: the proxy refuses
to start with the reason, rather than silently capturing something else. The decision is printed at
start, served on `/health`, exported as a metric and carried by every capture record (`mode`).

A proxy given no model (`tracefleet proxy --engine URL` alone, an external engine without `model`) asks
the engine which one it serves (`engine_named_model`), so `auto` runs exact for a supported model instead
of falling back to server for want of a name.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Gauge

from tracefleet.formats.families import FAMILIES, ModelFormat, load_model_format, model_dir, recognised_family
from tracefleet.formats.models import MODELS

from tracefleet.proxy.config import ProxyConfig
from tracefleet.proxy.engine_client import EngineClient, EngineModelsUnreadable, engine_model_cards
from tracefleet.proxy.exact.engine import ExactTokenEngine
from tracefleet.proxy.token_engine import ServerTokenEngine, TokenEngine


class ExactModeUnavailable(ValueError):
    """`mode: exact` was asked for, but this proxy cannot render for the model."""


@dataclass(frozen=True)
class ModeDecision:
    requested: str  # auto | exact | server
    mode: str  # exact | server
    reason: str
    model: str | None = None  # where the tokenizer came from (exact), or was looked for
    family: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _model_ref(config: ProxyConfig) -> str | None:
    return config.model_path or config.served_model


def _readable_here(ref: str) -> bool:
    """Whether `ref` names a tokenizer this machine has: a shipped model, a .gguf file, a Hugging Face
    model directory or a hub id in the local cache (never downloaded)."""
    if ref in MODELS or (ref.endswith(".gguf") and Path(ref).expanduser().is_file()):
        return True
    try:
        return model_dir(ref) is not None
    except FileNotFoundError:  # not a directory, not in the local hub cache
        return False


def engine_named_model(config: ProxyConfig) -> ProxyConfig:
    """`config` with what the engine says filled in where the config names no tokenizer it can read (capture
    mode auto or exact): the served name harness calls go out under, and as exact mode's tokenizer the
    engine's `root` (vLLM: the path or hub id it loaded) or its model id, the first this machine can read.
    Unchanged when the engine cannot be asked (a sidecar may start before its engine): the decision then
    says there is no model, as before."""
    if config.mode == "server" or config.model_path or (config.served_model and _readable_here(config.served_model)):
        return config
    try:
        cards = engine_model_cards(config.engine_url, api_key=config.engine_api_key,
                                   timeout_s=min(5.0, config.engine_limits.connect_s))
    except EngineModelsUnreadable:
        return config
    card = next((c for c in cards if c["id"] == config.served_model), None if config.served_model else
                next(iter(cards), None))
    if card is None:
        return config
    # `root` first: the files the engine itself loaded (vLLM's model directory or hub id), when this machine
    # has them, render exactly as the engine does; a served name is only a name
    refs = [r for r in (card.get("root"), card["id"]) if isinstance(r, str) and r]
    return config.model_copy(update={"served_model": card["id"],
                                     "model_path": next((r for r in refs if _readable_here(r)), None)})


def _exact_format(config: ProxyConfig) -> ModelFormat:
    """The model format exact mode renders with, or ExactModeUnavailable saying why there is none."""
    ref = _model_ref(config)
    if not ref:
        raise ExactModeUnavailable(
            "no model to read a tokenizer from: give model_path (--model-path: a shipped model name, a .gguf file, a Hugging Face "
            "model directory, or a hub model id present in the local Hugging Face cache)")
    try:
        fmt = load_model_format(ref, family=config.model_family, tool_parser=config.tool_parser,
                                template_file=config.chat_template_file)
    except (OSError, ValueError) as exc:
        raise ExactModeUnavailable(f"cannot load the tokenizer and chat template of {ref!r}: {exc}") from None
    if not (config.model_family or config.tool_parser) and recognised_family(fmt.template) is None:
        raise ExactModeUnavailable(
            f"the chat template of {ref!r} is of no family exact mode parses ({', '.join(sorted(FAMILIES))}); "
            "name one with model_family / tool_parser if the model speaks it")
    return fmt


def select_token_engine(config: ProxyConfig, client: EngineClient) -> tuple[TokenEngine, ModeDecision]:
    """The token engine for `config.mode`, and the decision that picked it."""
    requested = config.mode
    config = engine_named_model(config)
    if requested == "server":
        engine = ServerTokenEngine(client, config.served_model, job_sampling=config.sampling)
        return engine, ModeDecision(requested, "server", "asked for")
    try:
        fmt = _exact_format(config)
    except ExactModeUnavailable as exc:
        if requested == "exact":
            raise
        decision = ModeDecision(requested, "server", f"exact mode unavailable: {exc}", model=_model_ref(config))
        return ServerTokenEngine(client, config.served_model, job_sampling=config.sampling), decision
    reason = "asked for" if requested == "exact" else "the model's family is supported"
    decision = ModeDecision(requested, "exact", reason, model=_model_ref(config), family=fmt.family.name)
    return ExactTokenEngine(client, fmt, config.served_model, job_sampling=config.sampling), decision


def register_mode_metric(registry: CollectorRegistry, decision: ModeDecision) -> None:
    gauge = Gauge("tracefleet_proxy_capture_mode", "Capture mode this proxy runs in (1 = current), with the mode "
                  "asked for and the model family exact mode renders for", ["mode", "requested", "family"],
                  registry=registry)
    gauge.labels(decision.mode, decision.requested, decision.family or "").set(1)
