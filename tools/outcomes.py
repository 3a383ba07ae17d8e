"""amfs_commit_outcome: tie a real-world result to the memories that led to it."""

from __future__ import annotations

from typing import Annotated

from fastmcp import Context
from pydantic import Field, WithJsonSchema

from ..core import validation as v
from ..core.service import MemoryService
from ._params import lenient_list
from ._registry import ToolRegistry, writes
from ._views import OutcomeEffectView, OutcomeResult, OutcomeTypeName


def register(tools: ToolRegistry[MemoryService]) -> None:
    service = tools.service

    @tools.tool(writes("Commit outcome", idempotent=True))
    async def amfs_commit_outcome(
        outcome_ref: Annotated[
            str,
            Field(
                min_length=1, max_length=v.MAX_OUTCOME_REF_LENGTH, description="Ticket, deploy or run id: 'INC-1042'."
            ),
        ],
        outcome_type: OutcomeTypeName,
        ctx: Context,
        causal_entry_keys: Annotated[
            list[str] | None,
            lenient_list,
            Field(min_length=1, max_length=1000),
            # The schema says what is accepted: the list (1-1,000 keys), a JSON-encoded list or one key as text
            # (pydantic's own put min/maxLength, string keywords, beside an array and left the text forms out).
            WithJsonSchema({
                "anyOf": [{"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 1000},
                          {"type": "string"}, {"type": "null"}],
                "default": None,
                "description": "'entity_path/key' entries to credit; default: every entry this session read. "
                               "A JSON-encoded list or a single key is accepted too.",
            }),
        ] = None,
    ) -> OutcomeResult:
        """Report a task's real-world result (deploy, incident, test run) against the memories behind
        it: their confidence is multiplied per outcome type (failures raise it so the lesson surfaces,
        success lowers it slightly). Once per outcome_ref. Returns confidence before and after."""
        record = await service.commit_outcome(tools.actor(ctx), outcome_ref, outcome_type, causal_entry_keys)
        return OutcomeResult(
            outcome_ref=record.outcome_ref, outcome_type=record.outcome_type.value, multiplier=record.multiplier,
            already_applied=record.already_applied,
            updated=[
                OutcomeEffectView(
                    entry_key=effect.entry_key, version_read=effect.version_read,
                    version_updated=effect.version_updated, confidence_before=effect.confidence_before,
                    confidence_after=effect.confidence_after,
                )
                for effect in record.effects
            ],
        )
