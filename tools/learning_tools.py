"""Learning over MCP: the `InteractionRecorder` middleware (records every tool call) and the tools
amfs_record_interaction, amfs_get_preferences, amfs_set_preference, amfs_patterns, amfs_suggest_next.

`register_learning_tools(mcp, learning, actors)` installs what the learning settings allow: nothing
with learning off; the recorder and amfs_record_interaction with it on; the preference tools unless
preference learning is off; the pattern tools unless pattern detection is off. Each tool is one
LearningService call, registered through `ToolRegistry` so domain errors become tool errors in the one
usual place.
"""

from __future__ import annotations

import json
import logging
import time
from datetime import datetime
from typing import Annotated, Any

from fastmcp import Context, FastMCP
from fastmcp.server.middleware import CallNext, Middleware, MiddlewareContext
from fastmcp.tools.base import ToolResult
from pydantic import BaseModel, Field

from ..core.learning import (
    MAX_NAME_CHARS,
    MAX_OUTCOME_CHARS,
    ActionLevel,
    LearningService,
    Pattern,
    Preference,
    ResultMeta,
)
from ..core.redaction import redacted_paths
from ._registry import ActorResolver, ToolRegistry, read_only, writes

logger = logging.getLogger("amfs_server.learning")

LEARNING_TOOLS = frozenset({
    "amfs_record_interaction", "amfs_get_preferences", "amfs_set_preference", "amfs_patterns", "amfs_suggest_next",
})
"""Not recorded by the recorder: asking what was learned is not a habit to learn from, and a reported
interaction is recorded by amfs_record_interaction itself."""

ToolName = Annotated[
    str,
    Field(min_length=1, max_length=MAX_NAME_CHARS, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:/-]*$",
          description="A tool's name, e.g. 'github_create_issue'."),
]
Category = Annotated[
    str | None, Field(min_length=1, max_length=MAX_NAME_CHARS, description="Only this category (a tool name or a topic).")
]
MinConfidence = Annotated[float | None, Field(ge=0, le=1, description="Skip items less confident than this.")]


def result_meta(result: Any) -> ResultMeta:
    """Size, error flag and top-level field names of a tool result; the body itself is dropped here."""
    structured = getattr(result, "structured_content", None)
    content = getattr(result, "content", None) or []
    body: Any = structured if structured is not None else [
        block.model_dump(mode="json") if hasattr(block, "model_dump") else str(block) for block in content
    ]
    try:
        size = len(json.dumps(body, ensure_ascii=False, default=str).encode())
    except (TypeError, ValueError):
        size = 0
    fields = tuple(str(name) for name in structured)[:50] if isinstance(structured, dict) else ()
    return ResultMeta(size_bytes=size, is_error=bool(getattr(result, "is_error", False)), fields=fields)


class InteractionRecorder(Middleware):
    """Records each MCP tool call with LearningService.record_interaction: name, arguments (of amfs's
    own tools only options and shapes, of a refused call none: decided there), result metadata,
    execution time, caller. Recording never changes or fails the call. A read-only key's calls are not
    recorded: nothing is learned from them, so they change nothing."""

    def __init__(self, learning: LearningService, actors: ActorResolver) -> None:
        self.learning = learning
        self.actors = actors

    async def on_call_tool(self, context: MiddlewareContext[Any], call_next: CallNext[Any, ToolResult]) -> ToolResult:
        name = context.message.name
        if name in LEARNING_TOOLS or not self.learning.config.enabled or context.fastmcp_context is None:
            return await call_next(context)
        arguments = dict(context.message.arguments or {})
        started = time.perf_counter()
        try:
            result = await call_next(context)
        except Exception as error:
            await self._record(context, name, arguments, ResultMeta(is_error=True, error_type=type(error).__name__), started)
            raise
        await self._record(context, name, arguments, result_meta(result), started)
        return result

    async def _record(
        self, context: MiddlewareContext[Any], name: str, arguments: dict[str, Any], meta: ResultMeta, started: float
    ) -> None:
        elapsed_ms = (time.perf_counter() - started) * 1000
        try:
            actor = self.actors(context.fastmcp_context)  # type: ignore[arg-type]
            if actor.read_only:
                return  # a read-only key changes nothing, the learning store included (red-team repro)
            await self.learning.record_interaction(
                actor, name, arguments, result=meta, execution_ms=round(elapsed_ms, 3), source="mcp"
            )
        except Exception:
            logger.warning("Could not record the %s call for learning", name, exc_info=True)


# -- what the tools return ------------------------------------------------------------------------


class RecordedInteraction(BaseModel):
    recorded: bool = Field(description="False when learning is off.")
    interaction_id: str | None = None
    tool_name: str
    redacted: list[str] = Field(description="Parameters stored as [REDACTED] because they looked like credentials.")


class PreferenceView(BaseModel):
    category: str
    key: str
    value: Any
    confidence: float
    action: ActionLevel = Field(description="none | suggest | confirm (apply, then confirm) | auto_apply.")
    sample_size: int
    source: str = Field(description="observed (from tool calls) or corrected (set explicitly).")
    sessions: int = Field(description="Sessions the value was used in; an observed one needs 2 to reach confirm.")
    updated_at: datetime

    @classmethod
    def of(cls, p: Preference) -> PreferenceView:
        return cls(category=p.category, key=p.key, value=p.value, confidence=round(p.confidence, 4), action=p.action,
                   sample_size=p.sample_size, source=p.source, sessions=p.sessions, updated_at=p.updated_at)


class PreferencesResult(BaseModel):
    count: int
    preferences: list[PreferenceView]
    thresholds: dict[str, float] = Field(description="Confidence at which each action level starts.")


class PatternView(BaseModel):
    pattern_id: str
    pattern_type: str = Field(description="recurring_parameter, workflow, time_of_day or insight.")
    tool_name: str
    description: str
    data: dict[str, Any]
    occurrences: int
    frequency: float
    confidence: float
    action: ActionLevel

    @classmethod
    def of(cls, p: Pattern) -> PatternView:
        return cls(pattern_id=p.pattern_id, pattern_type=p.pattern_type, tool_name=p.tool_name, description=p.describe(),
                   data=p.data, occurrences=p.occurrences, frequency=round(p.frequency, 4),
                   confidence=round(p.confidence, 4), action=p.action)


class PatternsResult(BaseModel):
    count: int
    patterns: list[PatternView]


class StepView(BaseModel):
    tool_name: str
    confidence: float
    action: ActionLevel
    usual_parameters: dict[str, Any] = Field(description="Values this user usually passes to the tool.")


class SuggestionView(BaseModel):
    workflow: list[str]
    next_steps: list[StepView]
    frequency: float
    confidence: float
    action: ActionLevel


class SuggestResult(BaseModel):
    tool_name: str
    count: int
    suggestions: list[SuggestionView]


# -- the tools ----------------------------------------------------------------------------------


def register_learning_tools(mcp: FastMCP, learning: LearningService, actors: ActorResolver) -> None:
    config = learning.config
    if not config.enabled:
        return
    mcp.add_middleware(InteractionRecorder(learning, actors))
    tools = ToolRegistry(mcp, learning, actors)  # type: ignore[arg-type]  # only .tool and .actor are used

    @tools.tool(writes("Record interaction"))
    async def amfs_record_interaction(
        tool_name: ToolName,
        ctx: Context,
        parameters: Annotated[
            dict[str, Any] | None, Field(description="The arguments you passed (credentials are redacted before storage).")
        ] = None,
        outcome: Annotated[
            str | None, Field(max_length=MAX_OUTCOME_CHARS, description="Short result: 'success', 'failed: 404'. Not the output.")
        ] = None,
        execution_ms: Annotated[float | None, Field(ge=0, allow_inf_nan=False, description="How long the call took.")] = None,
    ) -> RecordedInteraction:
        """Report a call you made to another tool (another MCP server's, or your own), so amfs learns
        your preferences and workflows from it. Calls to amfs tools are recorded already. Secrets in
        parameters are redacted, never stored."""
        interaction = await learning.record_interaction(
            tools.actor(ctx), tool_name, parameters, outcome=outcome, execution_ms=execution_ms, source="reported"
        )
        if interaction is None:
            return RecordedInteraction(recorded=False, tool_name=tool_name, redacted=[])
        return RecordedInteraction(
            recorded=True, interaction_id=interaction.interaction_id, tool_name=tool_name,
            redacted=redacted_paths(parameters or {}, interaction.parameters),
        )

    if config.preference_learning:

        @tools.tool(read_only("Get preferences"))
        async def amfs_get_preferences(
            ctx: Context, category: Category = None, min_confidence: MinConfidence = None
        ) -> PreferencesResult:
            """Your learned preferences (per tool or topic) with confidence and what to do: suggest,
            confirm (apply, then confirm) or auto_apply. By default only those at or above the suggest
            level; min_confidence=0 lists all."""
            threshold = config.thresholds.suggest if min_confidence is None else min_confidence
            found = await learning.get_preferences(tools.actor(ctx).agent_id, category, threshold)
            return PreferencesResult(
                count=len(found), preferences=[PreferenceView.of(p) for p in found],
                thresholds={"suggest": config.thresholds.suggest, "confirm": config.thresholds.confirm,
                            "auto_apply": config.thresholds.auto_apply},
            )

        @tools.tool(writes("Set preference", idempotent=False))
        async def amfs_set_preference(
            category: Annotated[
                str, Field(min_length=1, max_length=MAX_NAME_CHARS, description="'code_formatting' or a tool name.")
            ],
            key: Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS, description="'line_length'; no '.'.")],
            value: Annotated[Any, Field(description="The preferred value (any JSON).")],
            ctx: Context,
        ) -> PreferenceView:
            """Record what the user told you they prefer (a correction): it becomes the preference at
            confidence 0.4 and grows as later calls agree. Never pass credentials."""
            return PreferenceView.of(await learning.set_preference(tools.actor(ctx).agent_id, category, key, value))

    if config.pattern_detection:

        @tools.tool(read_only("Usage patterns"))
        async def amfs_patterns(
            ctx: Context,
            tool_name: Annotated[
                str | None, Field(min_length=1, max_length=MAX_NAME_CHARS, description="Only patterns about this tool.")
            ] = None,
            min_confidence: MinConfidence = None,
        ) -> PatternsResult:
            """Your detected usage patterns: recurring parameter values, workflows (tool sequences within
            sessions) and times of day, each with frequency, confidence and action level."""
            found = await learning.patterns(tools.actor(ctx).agent_id, tool_name, min_confidence)
            return PatternsResult(count=len(found), patterns=[PatternView.of(p) for p in found])

        @tools.tool(read_only("Suggest next step"))
        async def amfs_suggest_next(tool_name: ToolName, ctx: Context) -> SuggestResult:
            """After calling tool_name: the steps that usually follow it in your workflows, with the
            parameter values you usually pass and an action level (suggest, confirm, auto_apply).
            Empty when no workflow starts there."""
            found = await learning.suggest_next(tools.actor(ctx).agent_id, tool_name)
            return SuggestResult(
                tool_name=tool_name, count=len(found),
                suggestions=[
                    SuggestionView(
                        workflow=s.workflow, frequency=round(s.frequency, 4), confidence=round(s.confidence, 4),
                        action=s.action,
                        next_steps=[StepView(tool_name=step.tool_name, confidence=round(step.confidence, 4),
                                             action=step.action, usual_parameters=step.usual_parameters)
                                    for step in s.steps],
                    )
                    for s in found
                ],
            )


__all__ = ["LEARNING_TOOLS", "InteractionRecorder", "register_learning_tools", "result_meta"]
