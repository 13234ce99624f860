"""Which capture mode a proxy runs in, and why.

`auto` (the RolloutJob default) runs exact where the proxy can read the model's tokenizer and its chat
template belongs to a family whose output we parse, and server otherwise: a job on an unsupported model
still runs, with drift, instead of failing. `exact` asked for explicitly fails closed: the proxy refuses
to start with the reason, rather than silently capturing something else. The decision is printed at
start, served on `/health`, exported as a metric and carried by every capture record (`mode`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Gauge

from tracefleet.formats.families import FAMILIES, ModelFormat, load_model_format, recognised_family

from .config import ProxyConfig
from .engine_client import EngineClient
from .exact.engine import ExactTokenEngine
from .token_engine import ServerTokenEngine, TokenEngine


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
    if requested == "server":
        return ServerTokenEngine(client, config.served_model), ModeDecision(requested, "server", "asked for")
    try:
        fmt = _exact_format(config)
    except ExactModeUnavailable as exc:
        if requested == "exact":
            raise
        decision = ModeDecision(requested, "server", f"exact mode unavailable: {exc}", model=_model_ref(config))
        return ServerTokenEngine(client, config.served_model), decision
    reason = "asked for" if requested == "exact" else "the model's family is supported"
    decision = ModeDecision(requested, "exact", reason, model=_model_ref(config), family=fmt.family.name)
    return ExactTokenEngine(client, fmt, config.served_model), decision


def register_mode_metric(registry: CollectorRegistry, decision: ModeDecision) -> None:
    gauge = Gauge("tracefleet_proxy_capture_mode", "Capture mode this proxy runs in (1 = current), with the mode "
                  "asked for and the model family exact mode renders for", ["mode", "requested", "family"],
                  registry=registry)
    gauge.labels(decision.mode, decision.requested, decision.family or "").set(1)
