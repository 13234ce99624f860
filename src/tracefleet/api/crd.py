"""The RolloutJob CustomResourceDefinition, generated from the pydantic model.

Pydantic writes JSON Schema (2020-12: `$ref`s, `anyOf` with null for optional fields, `title`s);
Kubernetes wants a *structural* OpenAPI v3 schema: everything inlined, a `type` on every node, no
`anyOf` except the int-or-string idiom, no `additionalProperties` beside `properties`. This module
converts one into the other and refuses keywords it does not know, so a new model feature cannot
silently produce a schema the apiserver reads differently.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tracefleet.contract.job import (
    API_VERSION, CATEGORIES, CRD_NAME, DNS1123_SUBDOMAIN_RE, GROUP, JOB_NAME_MAX, KIND, PLURAL, SHORT_NAMES, SINGULAR, VERSION,
    RolloutJob,
)

CRD_FILENAME = f"{CRD_NAME}.yaml"

_COPY = {
    "type", "description", "default", "enum", "format", "pattern",
    "minimum", "maximum", "minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties",
    "required", "x-kubernetes-validations", "x-kubernetes-int-or-string", "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-list-type", "x-kubernetes-list-map-keys",
}
_DROP = {"title"}

# Lists whose items are keyed: the apiserver refuses duplicate keys and merges them by key on apply.
_LIST_MAP_KEYS = {
    ("spec", "tasks", "inline"): ["id"],
    ("status", "conditions"): ["type"],
}


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    if "$ref" not in node:
        return node
    name = node["$ref"].rsplit("/", 1)[-1]
    merged = dict(_resolve(defs[name], defs))
    merged.update({k: v for k, v in node.items() if k != "$ref"})
    return merged


def structural(node: dict[str, Any], defs: dict[str, Any], path: tuple[str, ...] = ()) -> dict[str, Any]:
    """One pydantic JSON-schema node as a Kubernetes structural schema node."""
    node = _resolve(node, defs)
    if "anyOf" in node:
        members = [_resolve(m, defs) for m in node["anyOf"] if m != {"type": "null"}]
        rest = {k: v for k, v in node.items() if k != "anyOf"}
        if node.get("x-kubernetes-int-or-string"):
            # Quantity: int | constrained str. The canonical apiserver form: anyOf of bare types + pattern.
            out = {k: v for k, v in rest.items() if k in {"x-kubernetes-int-or-string", "pattern", "description"}}
            out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
            return out
        if len(members) != 1:
            raise ValueError(f"{'.'.join(path)}: only Optional[X] unions map onto a structural schema, got {node['anyOf']}")
        # Optional field: nulls are pruned by the apiserver, None is "not set" in Python; one meaning.
        member = dict(members[0])
        member.update({k: v for k, v in rest.items() if not (k == "default" and v is None)})
        node = member
    if node.get("default", 1) is None:
        node = {k: v for k, v in node.items() if k != "default"}
    if "const" in node:
        node = {**{k: v for k, v in node.items() if k != "const"}, "enum": [node["const"]]}

    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP or key in {"properties", "items", "additionalProperties", "$defs"}:
            continue
        if key not in _COPY:
            raise ValueError(f"{'.'.join(path) or '<root>'}: JSON-schema keyword {key!r} has no structural mapping")
        out[key] = value
    if "x-kubernetes-validations" in out:
        # Pydantic sorts keys; keep the natural rule/message/fieldPath order for readers.
        out["x-kubernetes-validations"] = [
            {k: v[k] for k in ("rule", "message", "fieldPath") if k in v} for v in out["x-kubernetes-validations"]
        ]

    if "properties" in node:
        out["type"] = "object"
        out["properties"] = {k: structural(v, defs, path + (k,)) for k, v in node["properties"].items()}
        if out.get("default") not in (None, {}):
            raise ValueError(f"{'.'.join(path)}: object defaults must be {{}} (nested defaults fill it)")
    elif "additionalProperties" in node:
        extra = node["additionalProperties"]
        if extra is True or extra == {}:
            out["x-kubernetes-preserve-unknown-fields"] = True
        elif extra is not False:
            out["additionalProperties"] = structural(extra, defs, path + ("*",))
    if "items" in node:
        out["items"] = structural(node["items"], defs, path + ("[]",))
        if path in _LIST_MAP_KEYS:
            out["x-kubernetes-list-type"] = "map"
            out["x-kubernetes-list-map-keys"] = _LIST_MAP_KEYS[path]
    # An empty list or map means the same as none; keep stored objects free of `[]`/`{}` noise.
    if out.get("default") in ([], {}) and "properties" not in out:
        del out["default"]
    if "type" not in out and not (out.get("x-kubernetes-int-or-string") or out.get("x-kubernetes-preserve-unknown-fields")):
        raise ValueError(f"{'.'.join(path) or '<root>'}: no type")
    return {k: out[k] for k in sorted(out, key=_key_rank)}


_ORDER = ["type", "description", "required", "default", "enum", "format", "pattern"]
_LAST = ["x-kubernetes-validations", "items", "additionalProperties", "properties"]


def _key_rank(key: str) -> tuple[int, str]:
    if key in _ORDER:
        return (0, f"{_ORDER.index(key):02d}")
    if key in _LAST:
        return (2, f"{_LAST.index(key):02d}")
    return (1, key)


def openapi_schema() -> dict[str, Any]:
    """The structural OpenAPI v3 schema of the RolloutJob (the CRD's `openAPIV3Schema`)."""
    raw = RolloutJob.model_json_schema(by_alias=True, mode="validation")
    defs = raw.get("$defs", {})
    schema = structural(raw, defs)
    props = schema["properties"]
    # The apiserver owns these three; of metadata a CRD may only restrict the name (and generateName): to what the
    # children's names and labels need (tracefleet.contract.job.JOB_NAME_MAX), over the apiserver's own rule.
    props["apiVersion"] = {"type": "string", "description": "tracefleet.io/v1alpha1"}
    props["kind"] = {"type": "string", "description": "RolloutJob"}
    props["metadata"] = {"type": "object", "properties": {"name": {
        "type": "string", "maxLength": JOB_NAME_MAX, "pattern": DNS1123_SUBDOMAIN_RE}}}
    schema["required"] = ["spec"]
    schema["description"] = (
        "A RolloutJob runs agent sessions (tasks × samplesPerTask) through a real harness against an inference "
        "engine, scores them and seals token-level traces into batches in a bucket."
    )
    return {k: schema[k] for k in sorted(schema, key=_key_rank)}


PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Done", "type": "integer", "jsonPath": ".status.counters.succeeded", "description": "Sessions succeeded"},
    {"name": "Total", "type": "integer", "jsonPath": ".status.counters.total", "description": "Sessions in the job"},
    {"name": "Batches", "type": "integer", "jsonPath": ".status.batchesCompleted", "description": "Batches sealed"},
    {"name": "Quarantined", "type": "integer", "jsonPath": ".status.counters.quarantined",
     "description": "Sessions quarantined or dropped by diagnostics"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def crd_manifest() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME, "labels": {"app.kubernetes.io/part-of": "tracefleet"}},
        "spec": {
            "group": GROUP,
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": list(SHORT_NAMES),
                "categories": list(CATEGORIES),
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": openapi_schema()},
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                }
            ],
        },
    }


HEADER = (
    "# Generated by `tracefleet crd` from src/tracefleet/api/model.py. Do not edit by hand:\n"
    "# change the model and regenerate (tests/foundation/test_crd.py fails on drift).\n"
)


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    # Long descriptions and CEL rules stay on one line; readable and stable across PyYAML versions.
    return dumper.represent_scalar("tag:yaml.org,2002:str", value)


_Dumper.add_representer(str, _str)


def crd_yaml() -> str:
    return HEADER + yaml.dump(crd_manifest(), Dumper=_Dumper, sort_keys=False, width=1 << 16, allow_unicode=True)


def write_crd(out_dir: str | Path) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / CRD_FILENAME
    path.write_text(crd_yaml())
    return path


__all__ = ["API_VERSION", "CRD_FILENAME", "crd_manifest", "crd_yaml", "openapi_schema", "write_crd"]
