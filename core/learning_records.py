"""The learning records (interactions, preferences, patterns) and the snapshot both learning stores
read and write. Plain frozen dataclasses; the rules that make and change them live in `core.learning`."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

ActionLevel = Literal["none", "suggest", "confirm", "auto_apply"]
InteractionSource = Literal["mcp", "reported"]
PreferenceSource = Literal["observed", "corrected"]


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


@dataclass(frozen=True)
class ResultMeta:
    """What is kept of a tool's result: never the body."""

    size_bytes: int = 0
    is_error: bool = False
    fields: tuple[str, ...] = ()
    error_type: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"size_bytes": self.size_bytes, "is_error": self.is_error, "fields": list(self.fields)}
        if self.error_type is not None:
            out["error_type"] = self.error_type
        return out


def _iso(moment: datetime) -> str:
    return moment.isoformat()


@dataclass(frozen=True)
class Interaction:
    interaction_id: str
    user_id: str
    session_id: str
    tool_name: str
    source: InteractionSource
    parameters: dict[str, Any]
    outcome: Any
    result: dict[str, Any]
    execution_ms: float | None
    at: datetime

    def to_dict(self) -> dict[str, Any]:
        return {
            "interaction_id": self.interaction_id, "user_id": self.user_id, "session_id": self.session_id,
            "tool_name": self.tool_name, "source": self.source, "parameters": self.parameters,
            "outcome": self.outcome, "result": self.result, "execution_ms": self.execution_ms, "at": _iso(self.at),
        }


@dataclass(frozen=True)
class Preference:
    user_id: str
    category: str
    key: str
    value: Any
    confidence: float
    sample_size: int
    """Every observation and correction of this key, whatever the value."""
    support: int
    """Consistent evidence behind the current value: the n of the confidence curve."""
    source: PreferenceSource
    updated_at: datetime
    action: ActionLevel = "none"
    """What a caller should do at this confidence (filled in on read from the thresholds in force)."""
    sessions: int = 1
    """Sessions the current value was consistently seen in (counted when the session changes): an
    observed preference needs 2 before it may reach `confirm` (the two-session rule in core.learning)."""
    last_session: str = ""
    """The (pseudonymous, when anonymizing) session of the latest observation or correction."""

    @property
    def name(self) -> str:
        return f"{self.category}.{self.key}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "user_id": self.user_id, "category": self.category, "key": self.key, "value": self.value,
            "confidence": self.confidence, "sample_size": self.sample_size, "support": self.support,
            "source": self.source, "updated_at": _iso(self.updated_at), "sessions": self.sessions,
        }


@dataclass(frozen=True)
class Pattern:
    pattern_id: str
    user_id: str
    pattern_type: str
    tool_name: str
    data: dict[str, Any]
    occurrences: int
    frequency: float
    confidence: float
    discovered_at: datetime
    updated_at: datetime
    action: ActionLevel = "none"

    @property
    def tools(self) -> list[str]:
        return list(self.data.get("tools") or [self.tool_name])

    def describe(self) -> str:
        d = self.data
        if self.pattern_type == "recurring_parameter":
            value = canonical_json(d.get("value"))
            return f"{self.tool_name}({d.get('parameter')}={value}) in {d.get('matches')}/{d.get('calls')} calls"
        if self.pattern_type == "workflow":
            return f"workflow {' -> '.join(self.tools)} ({d.get('occurrences')}/{d.get('anchor_uses')} uses)"
        if self.pattern_type == "time_of_day":
            return f"{self.tool_name} at {d.get('at')} {d.get('timezone')} ({d.get('days')}/{d.get('active_days')} days)"
        return f"{self.pattern_type} {self.tool_name}: {canonical_json(d)[:120]}"

    def same_finding(self, other: Pattern) -> bool:
        return (self.data, self.occurrences, self.frequency, self.confidence) == (
            other.data, other.occurrences, other.frequency, other.confidence
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "pattern_id": self.pattern_id, "user_id": self.user_id, "pattern_type": self.pattern_type,
            "tool_name": self.tool_name, "data": self.data, "occurrences": self.occurrences,
            "frequency": self.frequency, "confidence": self.confidence,
            "discovered_at": _iso(self.discovered_at), "updated_at": _iso(self.updated_at),
        }


@dataclass(frozen=True)
class SuggestedStep:
    tool_name: str
    confidence: float
    action: ActionLevel
    usual_parameters: dict[str, Any]
    """Parameter values this user recurrently passes to the tool (recurring_parameter patterns)."""


@dataclass(frozen=True)
class Suggestion:
    tool_name: str
    workflow: list[str]
    steps: list[SuggestedStep]
    frequency: float
    confidence: float
    action: ActionLevel
    pattern_id: str


@dataclass(frozen=True)
class PreferenceChange:
    """A read-modify-write of one preference, applied atomically by the store."""

    user_id: str
    category: str
    key: str
    apply: Callable[[Preference | None], Preference]


@dataclass
class LearningSnapshot:
    interactions: list[Interaction] = field(default_factory=list)
    preferences: list[Preference] = field(default_factory=list)
    patterns: list[Pattern] = field(default_factory=list)
