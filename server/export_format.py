"""The export file format (`memory export` / `memory import`): strict Pydantic models at the edge."""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from datetime import datetime, timezone
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..core.ports import StoreSnapshot
from ..core.errors import ValidationError as RefusedError
from ..core.validation import DEFAULT_MAX_VALUE_BYTES, INT64_MAX, MAX_CONFIDENCE, refuse_lone_surrogates
from ..core.models import MemoryEntry, MemoryType, OutcomeRecord, OutcomeType, TraceEvent

EXPORT_FORMAT = "amfs-export"
EXPORT_VERSION = 1


class ExportFormatError(ValueError):
    """A file that is not a valid amfs export; the message says where and why."""


class _Provenance(BaseModel):
    model_config = ConfigDict(extra="forbid")
    agent_id: str
    session_id: str
    written_at: datetime


class _Entry(BaseModel):
    model_config = ConfigDict(extra="ignore")
    entity_path: str
    key: str
    value: Any
    version: int = Field(ge=1, le=INT64_MAX, strict=True)
    confidence: float = Field(ge=0, le=MAX_CONFIDENCE, strict=True)
    provenance: _Provenance
    outcome_count: int = Field(ge=0, le=INT64_MAX, strict=True)
    recall_count: int = Field(ge=0, le=INT64_MAX, strict=True)
    ttl_at: datetime | None
    memory_type: MemoryType
    tier: int = Field(ge=1, le=3, strict=True)
    priority_score: float | None = Field(strict=True)
    importance_score: float | None = Field(strict=True)
    importance_dimensions: dict[str, Annotated[float, Field(strict=True)]] | None
    embedding: list[Annotated[float, Field(strict=True)]] | None  # numbers, not text or booleans
    amfs_version: str
    event_at: datetime | None = None  # absent in exports written before event times existed
    # Base64 of little-endian float32 rows, each as long as `embedding` (`pack_rows`); absent before they existed.
    passage_embeddings: str | None = None
    context_key: str | None = None  # the key whose turn made the last passage embedding (absent before contexts)


class _Effect(BaseModel):
    model_config = ConfigDict(extra="ignore")
    entity_path: str
    key: str
    version_read: int | None = Field(ge=1, le=INT64_MAX, strict=True)
    version_updated: int = Field(ge=1, le=INT64_MAX, strict=True)
    confidence_before: float = Field(ge=0, le=MAX_CONFIDENCE, strict=True)
    confidence_after: float = Field(ge=0, le=MAX_CONFIDENCE, strict=True)


class _Outcome(BaseModel):
    model_config = ConfigDict(extra="forbid")
    outcome_ref: str
    outcome_type: OutcomeType
    multiplier: float = Field(gt=0, strict=True)
    committed_at: datetime
    agent_id: str
    session_id: str
    effects: list[_Effect]


class _Trace(BaseModel):
    model_config = ConfigDict(extra="forbid")
    session_id: str
    agent_id: str
    kind: Literal["read", "retrieve", "write"]
    entity_path: str
    key: str
    version: int = Field(ge=1, le=INT64_MAX, strict=True)
    at: datetime
    detail: dict[str, Any] | None = None


class ExportFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    format: Literal["amfs-export"]
    version: Literal[1]
    exported_at: datetime
    entries: list[_Entry]
    outcomes: list[_Outcome]
    traces: list[_Trace]
    meta: dict[str, Any]
    extra: dict[str, list[dict[str, Any]]] = Field(default_factory=dict)


def pack_rows(rows: list[list[float]] | None) -> str | None:
    """Sentence embeddings as base64 float32: a third of the JSON number lists' size, and exact (stores keep float32)."""
    if not rows:
        return None
    import numpy as np

    return base64.b64encode(np.asarray(rows, dtype="<f4").tobytes()).decode("ascii")


def unpack_rows(text: str | None, dimension: int, where: str) -> list[list[float]] | None:
    if text is None:
        return None
    import numpy as np

    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise ExportFormatError(f"invalid export at {where}: not base64") from None
    if dimension <= 0 or not raw or len(raw) % (4 * dimension):
        raise ExportFormatError(
            f"invalid export at {where}: {len(raw)} bytes are not whole float32 rows of the embedding's dimension "
            f"({dimension})")
    rows = np.frombuffer(raw, dtype="<f4").reshape(-1, dimension)
    if not np.all(np.isfinite(rows)):
        raise ExportFormatError(f"invalid export at {where}: every number in an export must be finite")
    values: list[list[float]] = rows.astype(np.float64).tolist()
    return values


def _entry_document(entry: MemoryEntry) -> dict[str, Any]:
    return {**entry.to_dict(), "passage_embeddings": pack_rows(entry.passage_embeddings)}


def dump_export(snapshot: StoreSnapshot) -> str:
    document = {
        "format": EXPORT_FORMAT,
        "version": EXPORT_VERSION,
        "exported_at": datetime.now(timezone.utc).isoformat(),
        "entries": [_entry_document(entry) for entry in snapshot.entries],
        "outcomes": [record.to_dict() for record in snapshot.outcomes],
        "traces": [trace.to_dict() for trace in snapshot.traces],
        "meta": snapshot.meta,
        "extra": snapshot.extra,
    }
    return json.dumps(document, ensure_ascii=False, indent=1, allow_nan=False)  # standard JSON only


def parse_export(text: str, max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES) -> StoreSnapshot:
    """The snapshot an export file holds, refused (`ExportFormatError`, saying where) wherever a write would refuse
    it too: a value over `max_value_bytes` (the importing store's limit), a number of the wrong type, a key an
    object repeats."""
    try:
        raw = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float,
                         object_pairs_hook=_without_repeated_keys)
    except json.JSONDecodeError as error:
        raise ExportFormatError(f"not JSON ({error})") from None
    except RecursionError:
        raise ExportFormatError("JSON nested too deeply to read; an export is a few levels deep") from None
    except ExportFormatError:
        raise
    except ValueError as error:  # an integer of more than 4,300 digits
        raise ExportFormatError(f"a number that cannot be read ({str(error).split(';')[0]})") from None
    if _SURROGATE_ESCAPE.search(text):  # walking the document costs as much as parsing it: only when one may be there
        _refuse_lone_surrogates(raw)
    try:
        ExportFile.model_validate(raw)
    except ValidationError as error:
        first = error.errors()[0]
        location = ".".join(str(part) for part in first["loc"])
        raise ExportFormatError(f"invalid export at {location or 'top level'}: {first['msg']} ({error.error_count()} problems)") from None
    _check_versions(raw["entries"])
    _check_values(raw["entries"], max_value_bytes)
    _check_references(raw["outcomes"], raw["traces"])
    return StoreSnapshot(
        entries=[_entry_from_document(entry, position) for position, entry in enumerate(raw["entries"])],
        outcomes=[OutcomeRecord.from_dict(record) for record in raw["outcomes"]],
        traces=[TraceEvent.from_dict(trace) for trace in raw["traces"]],
        meta=raw["meta"],
        extra=raw.get("extra", {}),
    )


# The largest float32: the stores keep vectors as float32, and 1e39 became infinity there, after which export,
# search and re-embed of the store failed until the key was found and forgotten (red-team repro).
_FLOAT32_MAX = 3.4028234663852886e38
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _refuse_lone_surrogates(raw: Any) -> None:
    try:
        refuse_lone_surrogates(raw, "")
    except RefusedError as error:
        raise ExportFormatError(f"invalid export: {error}") from None


def _entry_from_document(data: dict[str, Any], position: int) -> MemoryEntry:
    embedding = data.get("embedding") or ()
    if any(abs(x) > _FLOAT32_MAX for x in embedding):
        raise ExportFormatError(f"invalid export at entries.{position}.embedding: a number beyond float32's range "
                                "(about 3.4e38), which a store's vectors cannot hold")
    rows = unpack_rows(data.get("passage_embeddings"), len(embedding), f"entries.{position}.passage_embeddings")
    return MemoryEntry.from_dict({**data, "passage_embeddings": rows})


def _without_repeated_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object that names a key twice (JSON keeps the last silently) is no export this server wrote."""
    found = dict(pairs)
    if len(found) < len(pairs):
        seen: set[str] = set()
        repeated = next(key for key, _ in pairs if key in seen or seen.add(key))  # type: ignore[func-returns-value]
        raise ExportFormatError(f"a JSON object names the key {repeated[:80]!r} twice")
    return found


def _check_values(entries: list[dict[str, Any]], max_value_bytes: int) -> None:
    from ..core.errors import ValidationError as DomainValidationError
    from ..core.validation import serialize_value

    for position, entry in enumerate(entries):
        try:
            serialize_value(entry["value"], max_value_bytes)
        except DomainValidationError as error:
            raise ExportFormatError(f"invalid export at entries.{position}.value: {error}") from None


def _refuse_constant(name: str) -> float:
    raise ExportFormatError(f"{name} is not a JSON number; every number in an export must be finite")


def _finite_float(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise ExportFormatError(f"{text} overflows a double; every number in an export must be finite")
    return number


def _check_versions(entries: list[dict[str, Any]]) -> None:
    """Paths and keys follow the write rules, and each key's versions run 1..n without gaps or duplicates."""
    from ..core.errors import ValidationError as DomainValidationError
    from ..core.validation import validate_entity_path, validate_key

    versions: dict[tuple[str, str], list[int]] = {}
    for position, entry in enumerate(entries):
        try:
            validate_entity_path(entry["entity_path"])
            validate_key(entry["key"])
        except DomainValidationError as error:
            raise ExportFormatError(f"invalid export at entries.{position}: {error}") from None
        versions.setdefault((entry["entity_path"], entry["key"]), []).append(entry["version"])
    for (entity_path, key), numbers in versions.items():
        if sorted(numbers) != list(range(1, len(numbers) + 1)):
            raise ExportFormatError(
                f"invalid export: versions of '{entity_path}/{key}' are {sorted(numbers)}, expected 1..{len(numbers)}"
            )


def _check_references(outcomes: list[dict[str, Any]], traces: list[dict[str, Any]]) -> None:
    """The paths and keys that outcome effects and traces name follow the write rules too."""
    from ..core.errors import ValidationError as DomainValidationError
    from ..core.validation import validate_entity_path, validate_key

    named = [(f"outcomes.{i}.effects.{j}", effect) for i, record in enumerate(outcomes)
             for j, effect in enumerate(record["effects"])] + [(f"traces.{i}", trace) for i, trace in enumerate(traces)]
    for where, item in named:
        try:
            validate_entity_path(item["entity_path"])
            validate_key(item["key"])
        except DomainValidationError as error:
            raise ExportFormatError(f"invalid export at {where}: {error}") from None
