"""Tool declarations as TypeScript-style text (a small stand-in for the module Kimi ships).

Kimi K2.5's tokenizer directory ships a `tool_declaration_ts.py` that its
`tokenization_kimi.py` imports relatively; this one keeps that shape (and that import) so
the fixture exercises the same loading path. kimipipe's records carry no tools, so only
the basic shape is rendered.
"""

from __future__ import annotations

import json
from typing import Any


def _ts_type(schema: Any) -> str:
    if not isinstance(schema, dict):
        return "any"
    kind = schema.get("type")
    if kind == "object":
        props = schema.get("properties") or {}
        required = set(schema.get("required") or [])
        fields = [f"{name}{'' if name in required else '?'}: {_ts_type(sub)}"
                  for name, sub in sorted(props.items())]
        return "{" + ", ".join(fields) + "}"
    if kind == "array":
        return f"Array<{_ts_type(schema.get('items'))}>"
    if kind == "integer":
        return "number"
    if "enum" in schema:
        return " | ".join(json.dumps(v) for v in schema["enum"])
    return kind if isinstance(kind, str) else "any"


def encode_tools_to_typescript_style(tools: list[dict[str, Any]]) -> str:
    out = []
    for tool in tools or []:
        fn = tool.get("function") if tool.get("type") == "function" else None
        if not fn:
            continue
        if fn.get("description"):
            out.append("// " + fn["description"].replace("\n", "\n// "))
        out.append(f"type {fn.get('name', 'function')} = (_: {_ts_type(fn.get('parameters'))}) => any;")
    return "\n".join(out)
