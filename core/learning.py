"""Learning from tool interactions: the records (interactions, preferences, patterns), the confidence
curve and action levels, the `LearningStore` Protocol, and `LearningService`, the one API that the
MCP tools, the interaction recorder and the CLI call.

What is learned, and from what:

* Interactions: each MCP tool call (recorded by `tools.learning_tools.InteractionRecorder`) and each
  call a client reports with `amfs_record_interaction`: tool name, parameters, result metadata
  (size, error flag, error type, top-level field names; never the body), an optional short outcome,
  execution time, user, session, time. Kept `retention_days` (default 90). A call to this server's
  own tools keeps only its options and the shapes of its other arguments
  (`core.learning_signal.own_call_parameters`: never a memory's value, a query, a path or a key); a
  refused call keeps no parameters; a reported call keeps its parameters redacted (`core.redaction`).
* Preferences, per (user, category, key): every recorded interaction is an observation of each of
  its parameters that is plausibly a user's choice (`core.learning_signal.is_plausible_choice`) as
  category = tool name, key = parameter name. `set_preference` is an explicit correction.
  Confidence follows the curve in `preference_confidence`; an observed preference seen in one
  session only stays below `confirm` (`single_session_cap`).
* Patterns (`core.patterns`): recurring parameter values, workflows and times of day, re-detected
  lazily when they are read and the user's interactions changed since the last detection.

A user is the caller's agent id (the MCP client's name or AMFS_AGENT_ID); with `privacy.anonymize`
user and session ids are stored as stable pseudonyms. Nothing here needs a network or an API key;
an optional `InteractionAnalyzer` (an LLM, say) is a hook that is off unless one is passed in.
"""

from __future__ import annotations

import asyncio
import math
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field
from pydantic import ValidationError as PydanticValidationError

from .errors import NotFoundError, ValidationError
from .validation import has_hidden_characters, refuse_non_finite
from .models import Actor, utcnow
from .patterns import (
    PATTERN_TYPES,
    PatternDraft,
    PatternOptions,
    detect_patterns,
    pattern_id,
)
from .learning_signal import is_own_tool, is_plausible_choice, own_call_parameters
from .learning_records import (
    ActionLevel,
    Interaction,
    InteractionSource,
    LearningSnapshot,
    Pattern,
    Preference,
    PreferenceChange,
    PreferenceSource,
    ResultMeta,
    SuggestedStep,
    Suggestion,
    canonical_json,
)
from .ports import LearningStore
from .redaction import REDACTED, contains_redaction, looks_secret, pseudonym, redact
from .validation import INT64_MAX


# The confidence curve (see preference_confidence).
FIRST_EVIDENCE_CONFIDENCE = 0.4
DOUBT_KEPT_PER_OBSERVATION = 0.7

MAX_NAME_CHARS = 200
MAX_OUTCOME_CHARS = 500
MAX_PARAMETERS_BYTES = 16_384
"""Stored parameters larger than this (as JSON, after redaction) keep only their top-level names and size."""
MAX_PREFERENCE_VALUE_CHARS = 2000
SECTIONS = ("interactions", "preferences", "patterns")
"""The sections of an export's `extra` that learning owns."""

_TOOL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/-]*")


def preference_confidence(support: int) -> float:
    """Confidence in a preference value backed by `support` consistent observations.

    c(n) = 1 - 0.6 * 0.7^(n-1) for n >= 1, and 0 without support: the first observation (or a
    correction) gives 0.4, each consistent one keeps 70% of the remaining doubt. So 1 -> 0.40,
    2 -> 0.58, 3 -> 0.71, 4 -> 0.79, 5 -> 0.86, 10 -> 0.98: the document's "0.4 after one
    correction, 0.85 after 5 consistent uses, 0.98 after 10", and 5 uses cross the 0.8 auto-apply line.
    """
    if support <= 0:
        return 0.0
    return 1.0 - (1.0 - FIRST_EVIDENCE_CONFIDENCE) * DOUBT_KEPT_PER_OBSERVATION ** (support - 1)


@dataclass(frozen=True)
class Thresholds:
    """Confidence levels that decide what a caller does with a learned value."""

    suggest: float = 0.3
    confirm: float = 0.6
    auto_apply: float = 0.8

    def __post_init__(self) -> None:
        if not 0.0 <= self.suggest <= self.confirm <= self.auto_apply <= 1.0:
            raise ValidationError(
                f"Confidence thresholds must satisfy 0 <= suggest <= confirm <= auto_apply <= 1; got "
                f"suggest={self.suggest}, confirm={self.confirm}, auto_apply={self.auto_apply}."
            )

    def action_for(self, confidence: float) -> ActionLevel:
        """below suggest: none; suggest..confirm: suggest; confirm..auto_apply: confirm; above: auto_apply."""
        if confidence >= self.auto_apply:
            return "auto_apply"
        if confidence >= self.confirm:
            return "confirm"
        if confidence >= self.suggest:
            return "suggest"
        return "none"


@dataclass(frozen=True)
class LearningConfig:
    enabled: bool = True
    preference_learning: bool = True
    pattern_detection: bool = True
    retention_days: float = 90
    thresholds: Thresholds = field(default_factory=Thresholds)
    anonymize: bool = False
    patterns: PatternOptions = field(default_factory=PatternOptions)
    max_scan: int = 10_000
    """Pattern detection reads at most this many of a user's newest interactions."""
    purge_interval: timedelta = timedelta(hours=1)
    """While recording, retention is enforced at most this often (and always when the service opens)."""

    def __post_init__(self) -> None:
        if not self.retention_days > 0:
            raise ValidationError(f"retention_days must be > 0, got {self.retention_days}.")


class InteractionAnalyzer(Protocol):
    """The optional LLM hook: given one user's (already redacted) interactions, return extra findings.

    Off by default; the server never builds one itself. Its findings are stored as patterns (type
    `insight` unless it says otherwise) next to the detected ones.
    """

    async def analyze(self, user_id: str, interactions: Sequence[Interaction]) -> Sequence[PatternDraft]: ...


# -- preference transitions: the one place the curve is applied ------------------------------------


def _same(a: Any, b: Any) -> bool:
    return canonical_json(a) == canonical_json(b)


def observed(
    previous: Preference | None, user_id: str, category: str, key: str, value: Any, now: datetime, session: str = ""
) -> Preference:
    """One passive observation. The same value adds support; a different one halves it, and replaces
    the value once no support is left (the new value then starts without support, so values that
    change every call never get past confidence 0). `sessions` counts the sessions the current value
    was seen in (the two-session rule)."""
    if previous is None:
        return Preference(user_id, category, key, value, preference_confidence(1), 1, 1, "observed", now,
                          sessions=1, last_session=session)
    if _same(previous.value, value):
        support = previous.support + 1
        sessions = previous.sessions + (session != previous.last_session)
    else:
        support = previous.support // 2
        sessions = previous.sessions
        if previous.support == 0:
            return replace(previous, value=value, confidence=0.0, sample_size=previous.sample_size + 1,
                           support=0, source="observed", updated_at=now, sessions=1, last_session=session)
    return replace(previous, confidence=preference_confidence(support), sample_size=previous.sample_size + 1,
                   support=support, updated_at=now, sessions=sessions, last_session=session)


def corrected(
    previous: Preference | None, user_id: str, category: str, key: str, value: Any, now: datetime, session: str = ""
) -> Preference:
    """An explicit set: a new value starts over at support 1 (confidence 0.4); restating the current
    value counts as one more consistent observation."""
    if previous is not None and _same(previous.value, value):
        support = previous.support + 1
        return replace(previous, confidence=preference_confidence(support), sample_size=previous.sample_size + 1,
                       support=support, source="corrected", updated_at=now,
                       sessions=previous.sessions + (session != previous.last_session), last_session=session)
    sample_size = 1 if previous is None else previous.sample_size + 1
    return Preference(user_id, category, key, value, preference_confidence(1), sample_size, 1, "corrected", now,
                      sessions=1, last_session=session)


def single_session_cap(thresholds: Thresholds) -> float:
    """The highest confidence an observed preference seen in one session only may show: the last point
    of the confidence curve below `confirm` (0.58 with the default 0.6), so habits of a single
    conversation are at most suggested, never applied."""
    support, cap = 1, 0.0
    while (c := preference_confidence(support)) < thresholds.confirm and support < 1000:
        cap, support = c, support + 1
    return cap


# -- export / import records --------------------------------------------------------------------


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _InteractionRecord(_Record):
    interaction_id: str = Field(min_length=1, max_length=100)
    user_id: str = Field(min_length=1)
    session_id: str
    tool_name: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    source: InteractionSource
    parameters: dict[str, Any]
    outcome: Any = None
    result: dict[str, Any]
    execution_ms: float | None = None
    at: datetime


class _PreferenceRecord(_Record):
    user_id: str = Field(min_length=1)
    category: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    key: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    value: Any
    confidence: float = Field(ge=0, le=1)
    sample_size: int = Field(ge=0, le=INT64_MAX)
    support: int = Field(ge=0, le=INT64_MAX)
    source: PreferenceSource
    updated_at: datetime
    sessions: int = Field(default=1, ge=1, le=INT64_MAX)


class _PatternRecord(_Record):
    pattern_id: str = Field(min_length=1, max_length=100)
    user_id: str = Field(min_length=1)
    pattern_type: str = Field(min_length=1, max_length=50)
    tool_name: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    data: dict[str, Any]
    occurrences: int = Field(ge=0, le=INT64_MAX)
    frequency: float = Field(ge=0, le=1)
    confidence: float = Field(ge=0, le=1)
    discovered_at: datetime
    updated_at: datetime


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)


def parse_sections(sections: Mapping[str, Any], anonymize: bool = False) -> LearningSnapshot:
    """The learning sections of an export's `extra`, validated and run through redaction again, names by the
    same rules as the tools that record them (a hand-edited file cannot plant a secret). Raises ValidationError
    naming the first bad record."""
    snapshot = LearningSnapshot()
    for name, model in (("interactions", _InteractionRecord), ("preferences", _PreferenceRecord),
                        ("patterns", _PatternRecord)):
        records = sections.get(name) or []
        if not isinstance(records, list):
            raise ValidationError(f"extra.{name} must be a list of objects.")
        for index, raw in enumerate(records):
            try:
                record = model.model_validate(raw)
            except PydanticValidationError as error:
                first = error.errors()[0]
                where = ".".join(str(part) for part in first["loc"])
                raise ValidationError(f"Invalid extra.{name}[{index}].{where}: {first['msg']}. Nothing was imported.") from None
            try:
                if isinstance(record, (_InteractionRecord, _PatternRecord)):
                    validate_tool_name(record.tool_name)
                else:
                    validate_category(record.category)
                    validate_preference_key(record.key)
            except ValidationError as error:
                raise ValidationError(f"Invalid extra.{name}[{index}]: {error} Nothing was imported.") from None
            if isinstance(record, _InteractionRecord):
                snapshot.interactions.append(Interaction(
                    record.interaction_id, record.user_id, record.session_id, record.tool_name, record.source,
                    redact(record.parameters, anonymize=anonymize), redact(record.outcome, anonymize=anonymize,
                                                                           max_string=MAX_OUTCOME_CHARS),
                    redact(record.result), record.execution_ms, _aware(record.at),
                ))
            elif isinstance(record, _PreferenceRecord):
                # Dropped, not stored, as learning would have dropped it: a value that looks like a credential, or
                # any value under a credential's name ('db.password').
                if contains_redaction(redact({record.key: record.value}, max_string=MAX_PREFERENCE_VALUE_CHARS)):
                    continue
                snapshot.preferences.append(Preference(
                    record.user_id, record.category, record.key, record.value, record.confidence, record.sample_size,
                    record.support, record.source, _aware(record.updated_at), sessions=record.sessions,
                ))
            else:
                snapshot.patterns.append(Pattern(
                    record.pattern_id, record.user_id, record.pattern_type, record.tool_name, redact(record.data),
                    record.occurrences, record.frequency, record.confidence, _aware(record.discovered_at),
                    _aware(record.updated_at),
                ))
    return snapshot


# -- the service ----------------------------------------------------------------------------------


def validate_tool_name(name: Any) -> str:
    if not isinstance(name, str) or not name or len(name) > MAX_NAME_CHARS or not _TOOL_NAME.fullmatch(name):
        raise ValidationError(
            f"tool_name must be a tool's name (letters, digits, _ . : / -, at most {MAX_NAME_CHARS} characters), "
            f"e.g. 'github_create_issue'; got {name!r}."
        )
    if looks_secret(name):  # tool names are stored unredacted, so a credential must never pass as one
        raise ValidationError("tool_name looks like a credential; send the tool's name, e.g. 'github_create_issue'.")
    return name


def validate_category(category: Any) -> str:
    if not isinstance(category, str) or not category.strip() or len(category) > MAX_NAME_CHARS \
            or has_hidden_characters(category) or "/" in category:
        raise ValidationError(
            f"category must be 1-{MAX_NAME_CHARS} characters without '/' or control or invisible formatting "
            f"characters, e.g. 'code_formatting' or a tool name; got {category!r}."
        )
    return category


def validate_preference_key(key: Any) -> str:
    if not isinstance(key, str) or not key.strip() or len(key) > MAX_NAME_CHARS or has_hidden_characters(key) \
            or "." in key or "/" in key:
        # Invisible formatting characters too: `line_length\u200b` would look like `line_length` beside it.
        raise ValidationError(
            f"key must be 1-{MAX_NAME_CHARS} characters without '.', '/' or control or invisible formatting "
            f"characters, e.g. 'line_length'; got {key!r}."
        )
    return key


def split_preference_name(name: str) -> tuple[str, str]:
    """'code_formatting.style' -> ('code_formatting', 'style'); the key is what follows the last dot."""
    category, dot, key = name.rpartition(".")
    if not dot or not category or not key:
        raise ValidationError(f"A preference is named CATEGORY.KEY, e.g. 'code_formatting.style'; got {name!r}.")
    return validate_category(category), validate_preference_key(key)


def _bounded(parameters: dict[str, Any]) -> dict[str, Any]:
    size = len(canonical_json(parameters).encode())
    if size <= MAX_PARAMETERS_BYTES:
        return parameters
    return {"[TRUNCATED]": {"size_bytes": size, "names": list(parameters)[:100]}}


class LearningService:
    """Records interactions, learns preferences and patterns, and answers what a caller should do."""

    def __init__(
        self,
        store: LearningStore,
        config: LearningConfig | None = None,
        *,
        analyzer: InteractionAnalyzer | None = None,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.store = store
        self.config = config or LearningConfig()
        self.analyzer = analyzer
        self._clock = clock
        self._opened = False
        self._last_purge: datetime | None = None
        self._detected: dict[str, tuple[int, datetime | None]] = {}

    async def open(self) -> None:
        """Open the store and enforce retention. Idempotent; every method opens on first use."""
        if self._opened:
            return
        await self.store.open()
        self._opened = True
        await self.purge()

    async def close(self) -> None:
        if self._opened:
            self._opened = False
            await self.store.close()

    async def _ready(self) -> None:
        if not self._opened:
            await self.open()

    # -- identities and levels --------------------------------------------------------------

    def user_key(self, user_id: str) -> str:
        if not isinstance(user_id, str) or not user_id:
            raise ValidationError("user_id must be a non-empty string (the agent or user the data belongs to).")
        return pseudonym(user_id) if self.config.anonymize else user_id

    def _session_key(self, session_id: str) -> str:
        return pseudonym(session_id) if self.config.anonymize and session_id else session_id

    def action_for(self, confidence: float) -> ActionLevel:
        return self.config.thresholds.action_for(confidence)

    def _require(self, switch: str) -> None:
        if not self.config.enabled:
            raise ValidationError(
                "Learning is off (amfs-server serve --no-learning, learning.enabled: false or "
                "AMFS_LEARNING_ENABLED=false); nothing is recorded."
            )
        if switch == "preferences" and not self.config.preference_learning:
            raise ValidationError(
                "Preference learning is off (--no-preference-learning, learning.preference_learning: false "
                "or AMFS_PREFERENCE_LEARNING=false); nothing was recorded."
            )
        if switch == "patterns" and not self.config.pattern_detection:
            raise ValidationError(
                "Pattern detection is off (--no-pattern-detection, learning.pattern_detection: false or "
                "AMFS_PATTERN_DETECTION=false)."
            )

    # -- interactions -------------------------------------------------------------------------

    async def record_interaction(
        self,
        actor: Actor,
        tool_name: str,
        parameters: Mapping[str, Any] | None = None,
        *,
        outcome: Any = None,
        result: ResultMeta | None = None,
        execution_ms: float | None = None,
        source: InteractionSource = "reported",
    ) -> Interaction | None:
        """Record one tool call (redacted) and observe its parameters as preferences.

        Returns None, recording nothing, when learning is off.
        """
        if not self.config.enabled:
            return None
        tool_name = validate_tool_name(tool_name)
        if parameters is not None and not isinstance(parameters, Mapping):
            raise ValidationError(f"parameters must be an object of the tool's arguments, got {type(parameters).__name__}.")
        if execution_ms is not None and (isinstance(execution_ms, bool) or not isinstance(execution_ms, (int, float))
                                         or not (math.isfinite(execution_ms) and execution_ms >= 0)):
            # Infinity was stored, and every later `memory export` failed on it (red-team finding).
            raise ValidationError(f"execution_ms must be a finite number >= 0, got {execution_ms!r}.")
        result = result or ResultMeta()
        if source == "mcp" and result.is_error:
            parameters = {}  # a refused or failed call keeps no arguments: its error type is in `result`
        elif is_own_tool(tool_name):
            # A call to this server's own tools keeps options and shapes only, never memory content.
            parameters = own_call_parameters(parameters or {})
        # Only what would be kept is checked: a call refused for `confidence: Infinity` keeps no arguments, and its
        # record is not refused for it (it logged three tracebacks per call; red-team finding, 0.7.15).
        refuse_non_finite(parameters, "parameters")
        refuse_non_finite(outcome, "outcome")
        await self._ready()
        now = self._clock()
        user = self.user_key(actor.agent_id)
        session = self._session_key(actor.session_id)
        clean = _bounded(redact(dict(parameters or {}), anonymize=self.config.anonymize))
        interaction = Interaction(
            interaction_id=uuid.uuid4().hex,
            user_id=user,
            session_id=session,
            tool_name=tool_name,
            source=source,
            parameters=clean,
            outcome=redact(outcome, anonymize=self.config.anonymize, max_string=MAX_OUTCOME_CHARS),
            result=result.to_dict(),
            execution_ms=execution_ms,
            at=now,
        )
        changes: list[PreferenceChange] = []
        if self.config.preference_learning:
            for name, value in clean.items():
                if is_plausible_choice(name, value):
                    changes.append(self._change(observed, user, tool_name, name, value, now, session))
        await self.store.record(interaction, changes)
        await self._maybe_purge(now)
        return interaction

    async def interactions(self, user_id: str | None = None, limit: int | None = None) -> list[Interaction]:
        await self._ready()
        return await self.store.interactions(None if user_id is None else self.user_key(user_id), limit)

    async def purge(self, retention_days: float | None = None) -> int:
        """Delete interactions older than the retention period; patterns are re-detected from what is left."""
        days = self.config.retention_days if retention_days is None else retention_days
        if not days > 0:
            raise ValidationError(f"retention_days must be > 0, got {days}.")
        await self._ready()
        now = self._clock()
        removed = await self.store.purge_interactions(now - timedelta(days=days))
        self._last_purge = now
        if removed:
            self._detected.clear()
        return removed

    async def _maybe_purge(self, now: datetime) -> None:
        if self._last_purge is None or now - self._last_purge >= self.config.purge_interval:
            await self.purge()

    # -- preferences --------------------------------------------------------------------------

    @staticmethod
    def _change(
        transition: Callable[..., Preference], user: str, category: str, key: str, value: Any, now: datetime,
        session: str = "",
    ) -> PreferenceChange:
        return PreferenceChange(
            user, category, key, lambda previous: transition(previous, user, category, key, value, now, session)
        )

    def _checked_value(self, key: str, value: Any) -> Any:
        if contains_redaction(redact({key: value}, max_string=MAX_PREFERENCE_VALUE_CHARS)):  # the key's name counts
            raise ValidationError(
                "That value looks like a credential or is too long to be a preference; amfs never stores "
                f"credentials. Store a setting (at most {MAX_PREFERENCE_VALUE_CHARS} characters), not a secret."
            )
        refuse_non_finite(value, "value")
        canonical_json(value)  # must be JSON
        return value

    async def observe_preference(
        self, user_id: str, category: str, key: str, value: Any, session_id: str = ""
    ) -> Preference | None:
        """One consistent-or-not observation of a preference (what a tool call does for its parameters),
        made in session `session_id`. None, recording nothing, when learning or preference learning is off."""
        if not (self.config.enabled and self.config.preference_learning):
            return None
        category, key = validate_category(category), validate_preference_key(key)
        value = self._checked_value(key, value)
        await self._ready()
        user = self.user_key(user_id)
        change = self._change(observed, user, category, key, value, self._clock(), self._session_key(session_id))
        return self._with_action((await self.store.record(None, [change]))[0])

    async def set_preference(self, user_id: str, category: str, key: str, value: Any) -> Preference:
        """An explicit correction: the value becomes the preference, at confidence 0.4 when it changed."""
        self._require("preferences")
        category, key = validate_category(category), validate_preference_key(key)
        value = self._checked_value(key, value)
        await self._ready()
        user = self.user_key(user_id)
        stored = await self.store.record(None, [self._change(corrected, user, category, key, value, self._clock())])
        return self._with_action(stored[0])

    async def get_preferences(
        self, user_id: str | None, category: str | None = None, min_confidence: float | None = None
    ) -> list[Preference]:
        """The user's preferences (every user's with None), each with its action level."""
        await self._ready()
        user = None if user_id is None else self.user_key(user_id)
        found = await self.store.preferences(user, None if category is None else validate_category(category))
        shown = [self._with_action(p) for p in found]
        return [p for p in shown if min_confidence is None or p.confidence >= min_confidence]

    def _with_action(self, preference: Preference) -> Preference:
        """The preference as callers see it: its action level, and (the two-session rule) an observed
        preference seen in a single session only shows at most `single_session_cap`, below `confirm`."""
        confidence = preference.confidence
        if preference.source == "observed" and preference.sessions < 2:
            confidence = min(confidence, single_session_cap(self.config.thresholds))
        return replace(preference, confidence=confidence, action=self.action_for(confidence))

    async def forget_preference(self, user_id: str | None, category: str, key: str) -> int:
        """Delete a preference for one user (or every user with None); NotFoundError when none existed. What it
        was learned from goes with it (the parameter in the recorded calls of that tool, and the patterns found
        in them, detected again without it), so the value is no longer suggested either."""
        category, key = validate_category(category), validate_preference_key(key)
        await self._ready()
        user = None if user_id is None else self.user_key(user_id)
        removed = await self.store.delete_preference(user, category, key)
        if user is None:
            self._detected.clear()
        else:
            self._detected.pop(user, None)
        if removed == 0:
            raise NotFoundError(
                f"No learned preference '{category}.{key}'; nothing was forgotten. `amfs-server memory show` lists them."
            )
        return removed

    # -- patterns ---------------------------------------------------------------------------

    async def detect_patterns(self, user_id: str | None = None) -> list[Pattern]:
        """Detect patterns now (for one user, or every user with None) and store them."""
        self._require("patterns")
        await self._ready()
        users = [self.user_key(user_id)] if user_id is not None else await self.store.users()
        found: list[Pattern] = []
        for user in users:
            found += await self._detect(user, await self.store.interaction_stats(user))
        return [self._pattern_with_action(p) for p in found]

    async def _detect(self, user: str, stats: tuple[int, datetime | None]) -> list[Pattern]:
        interactions = await self.store.interactions(user, self.config.max_scan)
        # Off the event loop: up to max_scan calls to look through, while other clients wait on the loop.
        drafts = await asyncio.to_thread(detect_patterns, interactions, self.config.patterns)
        if self.analyzer is not None and interactions:
            drafts += [self._checked_draft(d) for d in await self.analyzer.analyze(user, interactions)]
        existing = {p.pattern_id: p for p in await self.store.patterns(user)}
        now = self._clock()
        patterns: list[Pattern] = []
        for draft in drafts:
            pid = pattern_id(user, draft.pattern_type, draft.signature)
            fresh = Pattern(pid, user, draft.pattern_type, draft.tool_name, draft.data, draft.occurrences,
                            round(draft.frequency, 6), round(draft.confidence, 6), now, now)
            old = existing.get(pid)
            if old is not None:
                fresh = old if old.same_finding(fresh) else replace(fresh, discovered_at=old.discovered_at)
            patterns.append(fresh)
        if {p.pattern_id: p.to_dict() for p in patterns} != {pid: p.to_dict() for pid, p in existing.items()}:
            await self.store.replace_patterns(user, patterns)
        self._detected[user] = stats
        return patterns

    @staticmethod
    def _checked_draft(draft: PatternDraft) -> PatternDraft:
        if draft.pattern_type not in PATTERN_TYPES:
            raise ValidationError(
                f"The interaction analyzer returned pattern type {draft.pattern_type!r}; use one of {PATTERN_TYPES}."
            )
        return replace(draft, data=redact(draft.data), frequency=min(max(draft.frequency, 0.0), 1.0),
                       confidence=min(max(draft.confidence, 0.0), 1.0))

    async def _refresh(self, user: str | None) -> None:
        """Re-detect the patterns of users whose interactions changed since their last detection."""
        if not (self.config.enabled and self.config.pattern_detection):
            return
        for uid in [user] if user is not None else await self.store.users():
            stats = await self.store.interaction_stats(uid)
            if self._detected.get(uid) != stats:
                await self._detect(uid, stats)

    async def patterns(
        self,
        user_id: str | None = None,
        tool_name: str | None = None,
        min_confidence: float | None = None,
        *,
        include_redundant: bool = False,
    ) -> list[Pattern]:
        """Detected patterns, strongest first. `tool_name` keeps those about that tool (workflows that
        include it too). A workflow that is the tail of a longer one seen as often is left out unless
        `include_redundant`: it says nothing the longer one does not."""
        await self._ready()
        user = None if user_id is None else self.user_key(user_id)
        await self._refresh(user)
        found = await self.store.patterns(user)
        if not include_redundant:
            found = _without_redundant_workflows(found)
        if tool_name is not None:
            found = [p for p in found if p.tool_name == tool_name or tool_name in p.tools]
        if min_confidence is not None:
            found = [p for p in found if p.confidence >= min_confidence]
        found.sort(key=lambda p: (-p.confidence, p.user_id, p.pattern_type, p.pattern_id))
        return [self._pattern_with_action(p) for p in found]

    def _pattern_with_action(self, pattern: Pattern) -> Pattern:
        return replace(pattern, action=self.action_for(pattern.confidence))

    async def suggest_next(self, user_id: str, tool_name: str) -> list[Suggestion]:
        """The steps that usually follow `tool_name` in this user's detected workflows, with the
        parameter values the user recurrently passes to them."""
        tool_name = validate_tool_name(tool_name)
        patterns = await self.patterns(user_id, include_redundant=True)
        usual: dict[str, dict[str, Any]] = {}
        for p in patterns:
            if p.pattern_type == "recurring_parameter" and p.action != "none":
                usual.setdefault(p.tool_name, {}).setdefault(p.data["parameter"], p.data["value"])
        suggestions: list[Suggestion] = []
        for p in patterns:
            if p.pattern_type != "workflow" or p.tools[0] != tool_name:
                continue
            steps = [
                SuggestedStep(step["tool"], step["confidence"], self.action_for(step["confidence"]),
                              usual.get(step["tool"], {}))
                for step in p.data.get("steps", [])
            ]
            suggestions.append(Suggestion(tool_name, p.tools, steps, p.frequency, p.confidence, p.action, p.pattern_id))
        suggestions.sort(key=lambda s: -s.confidence)
        return suggestions

    # -- maintenance and portability ------------------------------------------------------------

    async def clear(self) -> None:
        await self._ready()
        await self.store.clear()
        self._detected.clear()

    async def export(self) -> dict[str, list[dict[str, Any]]]:
        """The `extra` sections of an export: interactions, preferences, patterns (redacted again)."""
        await self._ready()
        snapshot = await self.store.export_snapshot()
        return {
            "interactions": [
                {**i.to_dict(), "parameters": redact(i.parameters), "outcome": redact(i.outcome, max_string=MAX_OUTCOME_CHARS)}
                for i in snapshot.interactions
            ],
            "preferences": [p.to_dict() for p in snapshot.preferences
                            if not contains_redaction(redact(p.value, max_string=MAX_PREFERENCE_VALUE_CHARS))],
            "patterns": [p.to_dict() for p in snapshot.patterns],
        }

    async def check_import(self, sections: Mapping[str, Any]) -> LearningSnapshot:
        """Validate the sections and check that importing them would be refused for nothing; writes nothing."""
        snapshot = parse_sections(sections, self.config.anonymize)
        await self._ready()
        await self.store.import_snapshot(snapshot, check_only=True)
        return snapshot

    async def import_(self, sections: Mapping[str, Any]) -> LearningSnapshot:
        """Import an export's learning sections; refuses (writing nothing) on an existing interaction
        id or preference. Returns what was imported."""
        snapshot = parse_sections(sections, self.config.anonymize)
        await self._ready()
        await self.store.import_snapshot(snapshot)
        self._detected.clear()
        return snapshot


def _without_redundant_workflows(patterns: list[Pattern]) -> list[Pattern]:
    """Leave out each workflow that is the tail of a longer one of the same user seen at least as often. Linear:
    comparing every pair of workflows took 5.5 s for a user with 833 of them (red-team finding, 0.7.10)."""
    most_seen_tail: dict[tuple[str, tuple[str, ...]], int] = {}
    for other in patterns:
        if other.pattern_type == "workflow":
            for length in range(1, len(other.tools)):  # every proper tail
                tail = (other.user_id, tuple(other.tools[-length:]))
                most_seen_tail[tail] = max(most_seen_tail.get(tail, 0), other.occurrences)

    def redundant(p: Pattern) -> bool:
        return most_seen_tail.get((p.user_id, tuple(p.tools)), -1) >= p.occurrences

    return [p for p in patterns if p.pattern_type != "workflow" or not redundant(p)]


__all__ = [
    "ActionLevel", "Interaction", "InteractionAnalyzer", "LearningConfig", "LearningService", "LearningSnapshot",
    "LearningStore", "Pattern", "Preference", "PreferenceChange", "REDACTED", "ResultMeta", "SECTIONS",
    "SuggestedStep", "Suggestion", "Thresholds", "corrected", "observed", "preference_confidence",
    "split_preference_name",
]
