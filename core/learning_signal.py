"""What learning may keep of a tool call: signal, never content.

Two rules, used by the interaction recorder, preference learning and pattern detection alike:

* `own_call_parameters`: a call to one of this server's own tools is recorded as its scalar options
  (`OWN_TOOL_OPTIONS`: limit, depth, memory_type, mode, ...) plus the *shape* of every other argument
  (type and size). A memory's value, a query, entity paths and keys, outcome refs: none of it is
  kept, so forgetting a memory leaves nothing of it in the interaction log, and there is nothing to
  scrub there.
* `is_plausible_choice`: a parameter value can become a preference, or a recurring-parameter pattern,
  only when it looks like something a user chooses (a boolean, a small integer, a short identifier or
  option string, a short list of those), its name is not a content name (`query`, `text`, `message`,
  ...) and it is not a credential. Free text, floats, long strings and objects never are.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .redaction import contains_redaction, redact

OWN_TOOL_OPTIONS = frozenset({
    "limit", "depth", "memory_type", "mode", "sort_by", "explain", "min_confidence", "outcome_type", "version",
    "format", "per_entity", "apply", "revert", "max_new_tokens",
})
"""Arguments of this server's tools that are options a caller picks, not memory content. Only these
keep their value in the interaction log (and only when the value is a scalar or short identifier)."""

SHAPES_KEY = "[shapes]"
"""Where the recorded parameters of an own-tool call keep the type and size of every other argument.
The '[' keeps it out of preference learning and pattern detection."""

CONTENT_NAMES = frozenset({
    "value", "query", "text", "content", "body", "message", "description", "title", "prompt", "comment", "note",
    "notes", "summary", "question", "answer", "input", "output", "data", "payload", "search", "q", "sql", "code",
    "script", "command", "subject", "reason", "details", "instructions", "context", "memory",
})
"""Parameter names whose values are content whatever they look like (a one-word query is still a query)."""

MAX_CHOICE_INT = 10_000
MAX_CHOICE_CHARS = 40
MAX_CHOICE_ITEMS = 10
_OPTION_STRING = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/+@-]*")


OWN_TOOL_PREFIX = "amfs_"


def is_own_tool(tool_name: str) -> bool:
    """A tool of this server (whether its call was served over MCP or reported by a client)."""
    return tool_name.startswith(OWN_TOOL_PREFIX)


def value_shape(value: Any) -> dict[str, Any]:
    """Type and size of an argument, never its content."""
    if value is None:
        return {"type": "null"}
    if isinstance(value, bool):
        return {"type": "boolean"}
    if isinstance(value, (int, float)):
        return {"type": "number"}
    if isinstance(value, str):
        return {"type": "string", "chars": len(value)}
    if isinstance(value, Mapping):
        return {"type": "object", "keys": len(value)}
    if isinstance(value, (list, tuple)):
        return {"type": "array", "items": len(value)}
    return {"type": type(value).__name__}


def _option_value(value: Any) -> bool:
    if value is None or isinstance(value, (bool, int, float)):
        return True
    return isinstance(value, str) and len(value) <= MAX_CHOICE_CHARS and bool(_OPTION_STRING.fullmatch(value))


def own_call_parameters(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """What the interaction log keeps of a call to one of this server's tools: the scalar options
    and the shape of everything else."""
    kept: dict[str, Any] = {}
    shapes: dict[str, Any] = {}
    for name, value in arguments.items():
        if name in OWN_TOOL_OPTIONS and _option_value(value):
            kept[name] = value
        else:
            shapes[name] = value_shape(value)
    if shapes:
        kept[SHAPES_KEY] = shapes
    return kept


def _choice_scalar(value: Any) -> bool:
    if isinstance(value, bool):
        return True
    if isinstance(value, int):
        return abs(value) <= MAX_CHOICE_INT
    return isinstance(value, str) and len(value) <= MAX_CHOICE_CHARS and bool(_OPTION_STRING.fullmatch(value))


def is_plausible_choice(name: str, value: Any) -> bool:
    """True when `value`, passed as parameter `name`, is plausibly a user's choice (see the module doc)."""
    if value is None or name.startswith("[") or "." in name or "/" in name:
        return False
    if name.lower() in CONTENT_NAMES:
        return False
    if isinstance(value, list):
        ok = 0 < len(value) <= MAX_CHOICE_ITEMS and all(_choice_scalar(item) for item in value)
    else:
        ok = _choice_scalar(value)
    return ok and not contains_redaction(redact({name: value}))


__all__ = [
    "CONTENT_NAMES", "OWN_TOOL_OPTIONS", "SHAPES_KEY", "is_own_tool", "is_plausible_choice", "own_call_parameters", "value_shape",
]
