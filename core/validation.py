"""Input validation for everything that reaches the engine: one place, clear messages, nothing written on failure."""

from __future__ import annotations

import json
import math
import re
import unicodedata
from datetime import date, datetime, timedelta, timezone
from typing import Any

from .errors import ValidationError
from .models import MemoryType, OutcomeType

MAX_ENTITY_PATH_LENGTH = 255
MAX_SEGMENT_LENGTH = 64
MAX_KEY_LENGTH = 128
MAX_OUTCOME_REF_LENGTH = 200
DEFAULT_MAX_VALUE_BYTES = 1024 * 1024
# Confidence may exceed 1.0 on purpose: failures multiply it (x1.15 per critical failure) so that a memory
# tied to repeated failures ranks as a risk signal. 100 is reached from 1.0 after ~33 critical failures, past
# any useful ranking difference, and keeps every derived number (decay, priority, JSON output) finite.
MAX_CONFIDENCE = 100.0
INT64_MAX = 2**63 - 1  # both stores keep counts and versions in signed 64-bit integers
MAX_VERSION = INT64_MAX
MAX_TTL_SECONDS = 100 * 365 * 86_400.0  # a century; beyond it a TTL means "never", so leave ttl unset
_SEGMENT = re.compile(r"[A-Za-z0-9_.:@-]+")


def _check_segment(segment: str, what: str, original: str) -> None:
    if segment in {".", ".."}:
        raise ValidationError(f"{what} {original!r} contains {segment!r}; relative segments are not allowed.")
    if not _SEGMENT.fullmatch(segment):
        raise ValidationError(
            f"{what} {original!r} has an invalid segment {segment!r}: use letters, digits and . _ - : @ only."
        )


def validate_entity_path(entity_path: Any) -> str:
    if not isinstance(entity_path, str) or not entity_path:
        raise ValidationError("entity_path must be a non-empty string such as 'checkout-service' or 'myapp/auth'.")
    if len(entity_path) > MAX_ENTITY_PATH_LENGTH:
        raise ValidationError(f"entity_path is {len(entity_path)} characters; the limit is {MAX_ENTITY_PATH_LENGTH}.")
    segments = entity_path.split("/")
    if any(segment == "" for segment in segments):
        raise ValidationError(
            f"entity_path {entity_path!r} has an empty segment: no leading, trailing or doubled '/'."
        )
    for segment in segments:
        if len(segment) > MAX_SEGMENT_LENGTH:
            raise ValidationError(
                f"entity_path segment {segment[:20]!r}... is {len(segment)} characters; the limit is {MAX_SEGMENT_LENGTH}."
            )
        _check_segment(segment, "entity_path", entity_path)
    return entity_path


def validate_key(key: Any) -> str:
    if not isinstance(key, str) or not key:
        raise ValidationError("key must be a non-empty string such as 'retry-pattern'.")
    if len(key) > MAX_KEY_LENGTH:
        raise ValidationError(f"key is {len(key)} characters; the limit is {MAX_KEY_LENGTH}.")
    if "/" in key:
        raise ValidationError(f"key {key!r} contains '/'; put hierarchy in entity_path, e.g. entity_path='a/b', key='c'.")
    _check_segment(key, "key", key)
    return key


def validate_entity_prefix(entity_path: Any) -> str | None:
    """An optional entity-path filter: same rules as an entity path."""
    return None if entity_path is None else validate_entity_path(entity_path)


def serialize_value(value: Any, max_bytes: int = DEFAULT_MAX_VALUE_BYTES) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as error:
        raise ValidationError(
            f"value must be JSON-serializable (str, number, bool, null, list, dict; no NaN/Infinity): {error}"
        ) from None
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:  # a lone surrogate ("\ud800"): no store can hold it
        raise ValidationError("value holds a lone surrogate (\\ud800-\\udfff), which is not Unicode text; "
                              "nothing was written") from None
    if size > max_bytes:
        raise ValidationError(
            f"value is {size} bytes as JSON; the limit is {max_bytes} (AMFS_MAX_VALUE_BYTES). Store a summary or split it."
        )
    return text


def refuse_lone_surrogates(value: Any, name: str) -> None:
    """Refuse a lone surrogate ("\\ud800", which JSON can escape) in any string, key or value, of a JSON-like `value`
    (`name` in the message; "" names its parts from the top level): it is no Unicode text, no store can hold it, and
    the embedder's tokenizer and pydantic's serializer failed on it with a traceback ("Internal error")."""
    stack: list[tuple[Any, str]] = [(value, name)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise ValidationError(
                    f"{where or 'the top level'} holds a lone surrogate (\\ud800-\\udfff), which is not Unicode text; nothing was done."
                ) from None
        elif isinstance(item, dict):
            stack.extend((v, _member(where, k)) for k, v in item.items())
            stack.extend((key, f"{where or 'the top level'} (a key)") for key in item)  # popped first
        elif isinstance(item, (list, tuple)):
            stack.extend((v, f"{where}[{i}]") for i, v in enumerate(item))


_PLAIN_MEMBER = re.compile(r"[A-Za-z0-9_-]{1,64}")


def _member(where: str, key: Any) -> str:
    """`where.key` for a plain key; otherwise the key quoted, escaped and cut (a message must not carry a caller's
    newline, lone surrogate or 200,000 characters)."""
    if isinstance(key, str) and _PLAIN_MEMBER.fullmatch(key):
        return f"{where}.{key}" if where else key
    shown = repr(key) if len(repr(key)) <= 40 else repr(key)[:40] + "..."
    return f"{where}[{shown}]"


def refuse_non_finite(value: Any, name: str, max_depth: int = 8) -> None:
    """Refuse a NaN or infinite number anywhere in a JSON-like `value` (to `max_depth` levels; deeper parts are
    cut off by redaction anyway): stored, one would make every JSON export of the store fail, and redaction would
    keep it as the string "nan"."""
    stack: list[tuple[Any, str, int]] = [(value, name, 0)]
    while stack:
        item, where, depth = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            raise ValidationError(f"{where} is {item}; numbers must be finite (no NaN or Infinity).")
        if depth >= max_depth:
            continue
        if isinstance(item, dict):
            stack.extend((v, f"{where}.{k}", depth + 1) for k, v in item.items())
        elif isinstance(item, (list, tuple)):
            stack.extend((v, f"{where}[{i}]", depth + 1) for i, v in enumerate(item))


def validate_confidence(confidence: Any, name: str = "confidence") -> float:
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)):
        raise ValidationError(f"{name} must be a number between 0 and {MAX_CONFIDENCE:g}, got {confidence!r}.")
    if not math.isfinite(confidence) or not 0 <= confidence <= MAX_CONFIDENCE:
        raise ValidationError(
            f"{name} must be between 0 and {MAX_CONFIDENCE:g} (1.0 = verified; values above 1 mark a risk "
            f"signal that failures raise), got {confidence!r}."
        )
    return float(confidence)


def validate_min_confidence(min_confidence: Any) -> float | None:
    return None if min_confidence is None else validate_confidence(min_confidence, "min_confidence")


def validate_memory_type(memory_type: Any) -> MemoryType:
    try:
        return MemoryType(memory_type)
    except ValueError:
        raise ValidationError(
            f"memory_type {memory_type!r} is not one of {[t.value for t in MemoryType]}."
        ) from None


def validate_outcome_type(outcome_type: Any) -> OutcomeType:
    try:
        return OutcomeType(outcome_type.lower() if isinstance(outcome_type, str) else outcome_type)
    except ValueError:
        raise ValidationError(
            f"outcome_type {outcome_type!r} is not one of {[t.value for t in OutcomeType]}."
        ) from None


def has_hidden_characters(text: str) -> bool:
    """Whether `text` holds a control or format character (Unicode Cc, Cf: NUL, newline, escape, zero-width space,
    bidirectional overrides), which print as nothing or rearrange what is around them."""
    return any(unicodedata.category(char) in ("Cc", "Cf") for char in text)


def validate_outcome_ref(outcome_ref: Any) -> str:
    """The ref, stripped and in Unicode NFC: one incident is one ref however its accents were typed."""
    if not isinstance(outcome_ref, str) or not outcome_ref.strip():
        raise ValidationError("outcome_ref must be a non-empty string such as a ticket or deploy id ('INC-1042').")
    if len(outcome_ref) > MAX_OUTCOME_REF_LENGTH:
        raise ValidationError(f"outcome_ref is {len(outcome_ref)} characters; the limit is {MAX_OUTCOME_REF_LENGTH}.")
    stripped = outcome_ref.strip()
    if has_hidden_characters(stripped):
        # PostgreSQL text cannot hold NUL; a newline, escape code, zero-width or bidi character would forge lines
        # in logs and listings or make two refs that print alike count as two incidents
        raise ValidationError(
            f"outcome_ref {outcome_ref!r} contains a control or invisible formatting character; use printable text only."
        )
    return unicodedata.normalize("NFC", stripped)


def resolve_ttl(now: datetime, ttl_seconds: Any = None, ttl_at: datetime | None = None) -> datetime | None:
    if ttl_seconds is not None and ttl_at is not None:
        raise ValidationError("Give ttl_seconds or ttl_at, not both.")
    if ttl_seconds is not None:
        if isinstance(ttl_seconds, bool) or not isinstance(ttl_seconds, (int, float)) or not math.isfinite(ttl_seconds):
            raise ValidationError(f"ttl_seconds must be a positive number, got {ttl_seconds!r}.")
        if ttl_seconds <= 0:
            raise ValidationError(f"ttl_seconds must be > 0 (the TTL must lie in the future), got {ttl_seconds!r}.")
        if ttl_seconds > MAX_TTL_SECONDS:
            raise ValidationError(
                f"ttl_seconds must be at most {MAX_TTL_SECONDS:.0f} (100 years); leave it unset for no expiry, "
                f"got {ttl_seconds!r}."
            )
        if timedelta(seconds=float(ttl_seconds)) <= timedelta(0):
            # 1e-7 rounded to no time at all: the write was acknowledged and its key (older versions too) was gone
            raise ValidationError(f"ttl_seconds {ttl_seconds!r} is below the clock's resolution (one microsecond); "
                                  "the TTL must lie in the future.")
        return now + timedelta(seconds=float(ttl_seconds))
    if ttl_at is not None:
        if not isinstance(ttl_at, datetime):
            raise ValidationError(f"ttl_at must be a datetime (e.g. datetime.now(timezone.utc) + timedelta(days=1)), "
                                  f"got {type(ttl_at).__name__}; or pass ttl_seconds.")
        if ttl_at.tzinfo is None:
            raise ValidationError("ttl_at must be timezone-aware (e.g. datetime.now(timezone.utc) + timedelta(days=1)).")
        if ttl_at <= now:
            raise ValidationError(f"ttl_at {ttl_at.isoformat()} is not in the future.")
        if ttl_at - now > timedelta(seconds=MAX_TTL_SECONDS):
            raise ValidationError(f"ttl_at {ttl_at.isoformat()} is more than 100 years ahead (ttl_seconds' limit too); "
                                  "leave it unset for no expiry.")
    return ttl_at


def validate_importance(importance_score: Any, importance_dimensions: Any) -> tuple[float | None, dict[str, float] | None]:
    if importance_score is not None:
        if isinstance(importance_score, bool) or not isinstance(importance_score, (int, float)) or not (
            math.isfinite(importance_score) and 0.0 <= importance_score <= 1.0
        ):
            raise ValidationError(f"importance_score must be between 0.0 and 1.0, got {importance_score!r}.")
        importance_score = float(importance_score)
    if importance_dimensions is not None:
        if not isinstance(importance_dimensions, dict) or not all(
            isinstance(name, str) and isinstance(score, (int, float)) and not isinstance(score, bool)
            and math.isfinite(score) and 0.0 <= score <= 1.0
            for name, score in importance_dimensions.items()
        ):
            raise ValidationError("importance_dimensions must map dimension names to scores between 0.0 and 1.0.")
        importance_dimensions = {name: float(score) for name, score in importance_dimensions.items()}
    return importance_score, importance_dimensions


def validate_limit(limit: Any, maximum: int = 1000) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= maximum:
        raise ValidationError(f"limit must be an integer between 1 and {maximum}, got {limit!r}.")
    return limit


def validate_version(version: Any) -> int | None:
    if version is None:
        return None
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= MAX_VERSION:
        raise ValidationError(f"version must be an integer between 1 and {MAX_VERSION}, got {version!r}.")
    return version


# Event times outside these years are taken for typos or unit mix-ups (a timestamp in ms, year 20023), not events.
EVENT_AT_MIN_YEAR = 1800
EVENT_AT_MAX_YEAR = 2200


_MOMENT_EXAMPLE = "e.g. '2023-05-08' or '2023-05-08T14:30:00Z'"


def validate_event_time(value: Any, what: str = "event_at") -> datetime | None:
    """When the remembered event happened: a moment (`validate_moment`) within EVENT_AT_MIN_YEAR..MAX_YEAR."""
    if value is None:
        return None
    moment = _parse_moment(value, what)
    if moment is None or not EVENT_AT_MIN_YEAR <= moment.year <= EVENT_AT_MAX_YEAR:
        raise ValidationError(
            f"{what} {value!r} lies outside the supported years {EVENT_AT_MIN_YEAR}..{EVENT_AT_MAX_YEAR}; "
            f"give the date the event happened ({_MOMENT_EXAMPLE})."
        )
    return moment


def validate_moment(value: Any, what: str) -> datetime | None:
    """An ISO 8601 date ("2023-05-08", that day at 00:00 UTC) or datetime ("2023-05-08T14:30:00+02:00"; UTC when
    it names no zone), or a `datetime`/`date`. Returned in UTC."""
    if value is None:
        return None
    moment = _parse_moment(value, what)
    if moment is None:
        raise ValidationError(f"{what} {value!r} is out of range once in UTC ({_MOMENT_EXAMPLE}).")
    return moment


def _is_date_only(value: Any) -> bool:
    """A day with no time of day: a `date` (not a `datetime`) or an ISO date string such as "2023-12-31"."""
    if isinstance(value, date) and not isinstance(value, datetime):
        return True
    if isinstance(value, str):
        try:
            date.fromisoformat(value.strip())
        except ValueError:
            return False
        return True
    return False


def _parse_moment(value: Any, what: str) -> datetime | None:
    """`value` in UTC; None when shifting it to UTC overflows (year 1 or 9999 with a zone offset)."""
    example = _MOMENT_EXAMPLE
    moment: datetime
    if isinstance(value, datetime):
        moment = value
    elif isinstance(value, date):
        moment = datetime(value.year, value.month, value.day)
    elif isinstance(value, str):
        text = value.strip()
        try:
            moment = datetime.fromisoformat(text)
        except ValueError:
            raise ValidationError(
                f"{what} must be an ISO 8601 date or datetime ({example}), got {value!r}."
            ) from None
    else:
        raise ValidationError(f"{what} must be an ISO 8601 date or datetime string ({example}), got {value!r}.")
    try:
        return moment.replace(tzinfo=timezone.utc) if moment.tzinfo is None else moment.astimezone(timezone.utc)
    except OverflowError:
        return None


def validate_event_range(after: Any, before: Any) -> tuple[datetime | None, datetime | None]:
    """The `event_after` / `event_before` filters: each optional, validated like event_at, after <= before. A
    date alone as `event_before` includes that whole day (it read as its first instant, so an event at 10:00
    that day was left out of `event_before="2023-12-31"`)."""
    start, end = validate_event_time(after, "event_after"), validate_event_time(before, "event_before")
    if end is not None and _is_date_only(before):
        end += timedelta(days=1) - timedelta(microseconds=1)  # years stop at 2200: no overflow
    if start is not None and end is not None and start > end:
        raise ValidationError(
            f"event_after ({start.isoformat()}) is later than event_before ({end.isoformat()}); nothing could match."
        )
    return start, end
