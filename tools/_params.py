"""Parameter types shared by the tools: JSON-schema constraints and descriptions the model sees.

The limits come from core.validation, which enforces them again (and every other rule) on each call.
Types are strict at the MCP edge (the app sets strict_input_validation): "0.5" or true is not a number,
1.0 is not an integer. The one leniency is for list parameters (`lenient_list`): simple clients such as
the MCP Inspector CLI send a list as a JSON-encoded string, or a single string for a one-item list.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from pydantic import BeforeValidator, Field

from ..core import validation as v

EntityPath = Annotated[
    str,
    Field(
        min_length=1, max_length=v.MAX_ENTITY_PATH_LENGTH,
        description="What the memory is about, '/'-separated: 'checkout-service' or 'myapp/auth'.",
    ),
]
EntityFilter = Annotated[
    str | None,
    Field(
        min_length=1, max_length=v.MAX_ENTITY_PATH_LENGTH,
        description="Only entries at or under this entity path.",
    ),
]
Key = Annotated[
    str,
    Field(min_length=1, max_length=v.MAX_KEY_LENGTH, description="Name within the entity, no '/': 'retry-pattern'."),
]
MinConfidence = Annotated[
    float | None,
    Field(ge=0, allow_inf_nan=False, description="Skip entries whose effective confidence (after decay) is lower."),
]


def list_from_text(value: Any) -> Any:
    """'["a/b"]' -> ["a/b"] and "a/b" -> ["a/b"]; anything else goes on to the list's own validation."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text.startswith("["):
        try:
            return json.loads(text)
        except (ValueError, RecursionError):  # "[" * 5000 ran past the parser's recursion limit: an internal error
            return value  # reported as "not a valid list" by the list validation that follows
    return [value]


lenient_list = BeforeValidator(list_from_text)
"""Put inside Annotated[list[...] | None, lenient_list, Field(...)] for a list parameter."""

Confidence = Annotated[
    float,
    Field(
        ge=0, le=v.MAX_CONFIDENCE, allow_inf_nan=False,
        description=f"How sure you are; 1.0 = verified (at most {v.MAX_CONFIDENCE:g}).",
    ),
]
TtlSeconds = Annotated[
    float | None,
    Field(gt=0, le=v.MAX_TTL_SECONDS, allow_inf_nan=False, description="Expire after this many seconds."),
]
Version = Annotated[
    int | None, Field(ge=1, le=v.MAX_VERSION, description="A past version; default the current one.")
]
