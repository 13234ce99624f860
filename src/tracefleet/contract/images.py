"""The names of the images tracefleet is made of: what `tracefleet images build` tags, what the Helm chart's
defaults and the operator's flags name, and what a RolloutJob names in spec.harness.image.

    REGISTRY/tracefleet:TAG            the capture proxy sidecar, sealer and evaluator Jobs, the session program
                                       (`tracefleet run --in-pod`) of a `command` harness, a managed engine's gate
    REGISTRY/tracefleet-operator:TAG   the tracefleet image plus the operator's packages (kopf, the Kubernetes
                                       client): the Helm chart's Deployment; no pod of a job carries them
    REGISTRY/harness-PRESET:TAG        the tracefleet image plus one harness CLI (a bundle at BUNDLE_SOURCE_DIR,
                                       its bin/ on PATH): a harness pod's harness container, and the bundle
                                       image an init container copies into a Harbor task's pod

The registry and tag are the user's (`--registry`, `--tag`; the chart's `image.registry`, `image.tag`); the
defaults are the release's.
"""

from __future__ import annotations

from importlib import metadata

DEFAULT_REGISTRY = "ghcr.io/tracefleet"
TRACEFLEET = "tracefleet"
OPERATOR = "tracefleet-operator"
HARNESS_PREFIX = "harness-"
# The presets whose CLI an image carries: every preset but `command`, which runs any program and so runs in the
# tracefleet image itself (or an image of the user's).
COMMAND_PRESET = "command"
PRESET_PLACEHOLDER = "{preset}"  # in a harness image name template: the preset's name


def release_tag() -> str:
    """The installed tracefleet's version: the default tag, and the chart's appVersion."""
    return metadata.version("tracefleet")


def image_ref(registry: str, name: str, tag: str) -> str:
    return f"{registry.rstrip('/')}/{name}:{tag}"


def harness_image_name(preset: str) -> str:
    return f"{HARNESS_PREFIX}{preset}"


def default_harness_image(preset: str, template: str, command_image: str) -> str:
    """The image a harness of `preset` (its default applied: tracefleet.contract.session.HarnessConfig) runs in when
    its job names none: `template` with {preset} replaced (the image `tracefleet images build` makes for its CLI), or
    for the `command` preset the tracefleet image itself (`command_image`)."""
    return command_image if preset == COMMAND_PRESET else template.replace(PRESET_PLACEHOLDER, preset)
