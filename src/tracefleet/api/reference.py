"""The manifest reference (the docs page docs/reference/manifest.md, between its markers) generated from the same
schema the CRD carries."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterator

from tracefleet.api.crd import openapi_schema

START = "<!-- manifest-reference:start -->"
END = "<!-- manifest-reference:end -->"
REFERENCE_PAGE = "docs/reference/manifest.md"  # relative to the repository root


def _type(node: dict[str, Any]) -> str:
    if node.get("x-kubernetes-int-or-string"):
        return "quantity (int or string)"
    t = node.get("type", "any")
    if t == "array":
        return f"list of {_type(node['items'])}"
    if t == "object" and "additionalProperties" in node:
        return f"map of {_type(node['additionalProperties'])}"
    if t == "object" and "properties" not in node:
        return "object (free-form)"
    if "enum" in node:
        return " \\| ".join(f"`{v}`" for v in node["enum"])
    if "format" in node:
        return f"{t} ({node['format']})"
    return t


def _bounds(node: dict[str, Any]) -> str:
    parts = []
    if "minimum" in node and "maximum" in node:
        parts.append(f"{node['minimum']}–{node['maximum']}")
    elif "minimum" in node:
        parts.append(f"≥ {node['minimum']}")
    elif "maximum" in node:
        parts.append(f"≤ {node['maximum']}")
    if "maxItems" in node:
        parts.append(f"≤ {node['maxItems']} items")
    return ", ".join(parts)


def _rows(node: dict[str, Any], path: str, required: bool) -> Iterator[tuple[str, str, str, str]]:
    if path:
        default = f"`{json.dumps(node['default'])}`" if "default" in node and node["default"] != {} else ""
        kind = _type(node)
        bounds = _bounds(node)
        if bounds:
            kind += f" ({bounds})"
        if required:
            kind += ", **required**"
        desc = node.get("description", "")
        yield (f"`{path}`", kind, default, desc.replace("|", "\\|").replace("\n", " "))
    target = node["items"] if node.get("type") == "array" and "items" in node else node
    suffix = "[]" if target is not node else ""
    for name, child in target.get("properties", {}).items():
        yield from _rows(child, f"{path}{suffix}.{name}" if path else name, name in target.get("required", ()))


def _rules(node: dict[str, Any], path: str) -> Iterator[tuple[str, str]]:
    for v in node.get("x-kubernetes-validations", ()):
        yield (path + v.get("fieldPath", ""), v["message"])
    target = node["items"] if node.get("type") == "array" and "items" in node else node
    suffix = "[]" if target is not node else ""
    for name, child in target.get("properties", {}).items():
        yield from _rules(child, f"{path}{suffix}.{name}" if path else name)


def manifest_reference() -> str:
    """Markdown: every spec and status field with type, default and meaning, then the cross-field rules."""
    schema = openapi_schema()
    lines = [
        "`apiVersion: tracefleet.io/v1alpha1`, `kind: RolloutJob` (short name `rj`). Field names are camelCase.",
        "`tracefleet validate FILE…` checks a manifest locally with the same rules as the cluster.",
        "",
        "| field | type | default | meaning |",
        "|---|---|---|---|",
    ]
    for part in ("spec", "status"):
        for row in _rows(schema["properties"][part], part, part == "spec"):
            lines.append("| " + " | ".join(row) + " |")
    lines += ["", "Cross-field rules (CEL in the CRD, mirrored by `tracefleet validate`):", ""]
    for path, message in _rules(schema["properties"]["spec"], "spec"):
        lines.append(f"- `{path}`: {message}")
    return "\n".join(lines) + "\n"


_SECTION = re.compile(re.escape(START) + r"\n?(.*?)" + re.escape(END), re.S)


def page_section(text: str) -> str:
    m = _SECTION.search(text)
    if m is None:
        raise ValueError(f"no {START} … {END} section")
    return m.group(1)


def update_page(path: str | Path) -> bool:
    """Rewrite the page's marked section; True if it changed."""
    p = Path(path)
    text = p.read_text()
    page_section(text)
    new = _SECTION.sub(lambda _: f"{START}\n{manifest_reference()}{END}", text, count=1)
    if new != text:
        p.write_text(new)
        return True
    return False
