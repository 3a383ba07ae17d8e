"""Parameter types shared by the tools: JSON-schema constraints and descriptions the model sees.

The limits come from core.validation, which enforces them again (and every other rule) on each call.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

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
    float | None, Field(ge=0, description="Skip entries whose effective confidence (after decay) is lower.")
]
