"""Training-data export: decision traces (see `ml.traces`) as fine-tuning datasets.

- SFT: each clean trace (every outcome SUCCESS) that read 2+ entries and wrote a decision becomes one
  chat example `{"messages": [system, user, assistant]}`: the user turn is the context read, the
  assistant turn the decision written (its `amfs_write` arguments as JSON). The format that OpenAI
  fine-tuning and TRL's SFTTrainer accept; no other top-level keys, so neither rejects a line.
- DPO: per entity, a clean trace (chosen) against a failed one (rejected). The shared prompt lists the
  candidate memories (both traces' context); each answer says which memories it relied on and what it
  decided. TRL's conversational preference format: `{"prompt": [...], "chosen": [...], "rejected": [...]}`.
- Reward model: each outcome-linked entry with a label from its outcome history, the mean of
  +1.0 (success), -0.25 (minor_failure), -0.5 (failure), -1.0 (critical_failure); the document's
  shape `{"entry", "label", "outcome_type" (its most frequent), "outcome_count"}`.

`export` returns the document's result object; `export_jsonl` the JSONL text; `write_jsonl` streams
lines to a file (atomically renamed into place). With nothing to export each raises
`InsufficientDataError` naming what is missing (the document's minimum-data table).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import errno
import json
import logging
import os
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime
from itertools import islice
from pathlib import Path, PurePath
from typing import IO, Any

from ..core.ports import MemoryStore
from ..core import validation as v
from ..core.errors import InsufficientDataError, StoreError, ValidationError
from ..core.interprocess import acquire_exclusive, hold_while_open, remove_if_abandoned
from ..core.models import MemoryEntry, OutcomeType, split_entry_key, utcnow
from ..core.service import MemoryService
from ._common import Progress, no_progress, resolve_service
from .traces import DecisionTrace, OutcomeHistory, TraceRead, TraceWrite, under


class ExportFormat(str, enum.Enum):
    SFT = "sft"
    DPO = "dpo"
    REWARD_MODEL = "reward_model"


REWARD_LABELS: dict[OutcomeType, float] = {
    OutcomeType.SUCCESS: 1.0,
    OutcomeType.MINOR_FAILURE: -0.25,
    OutcomeType.FAILURE: -0.5,
    OutcomeType.CRITICAL_FAILURE: -1.0,
}
MAX_VALUE_CHARS = 4000
MAX_DPO_CANDIDATES = 20

SFT_SYSTEM = (
    "You are an engineering agent working from a shared memory (AMFS). Given the memories you read for a task, "
    "record your decision as a memory: reply with the amfs_write arguments as JSON."
)
DPO_SYSTEM = (
    "You are an engineering agent working from a shared memory (AMFS). Choose which of the candidate memories to "
    "rely on for the task, then state your decision."
)


@dataclass(frozen=True)
class ExportResult:
    """The document's result object; `output_path` is set (and `examples` empty) when lines went to a file."""

    format: str
    num_examples: int
    examples: list[dict[str, Any]] = field(default_factory=list)
    exported_at: str = ""
    output_path: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def resolve_format(value: ExportFormat | str) -> ExportFormat:
    try:
        return ExportFormat(value)
    except ValueError:
        raise ValidationError(
            f"Unknown export format {value!r}; use one of {[f.value for f in ExportFormat]}."
        ) from None


class TrainingDataExporter:
    def __init__(self, service_or_store: MemoryService | MemoryStore) -> None:
        self.service, _ = resolve_service(service_or_store)

    async def export(
        self, format: ExportFormat | str, entity_path: str | None = None, limit: int | None = None
    ) -> ExportResult:
        fmt, examples = await self._examples(format, entity_path, limit)
        return ExportResult(fmt.value, len(examples), examples, _now())

    async def export_jsonl(
        self, format: ExportFormat | str, entity_path: str | None = None, limit: int | None = None
    ) -> str:
        _, examples = await self._examples(format, entity_path, limit)
        return "".join(json.dumps(example, ensure_ascii=False) + "\n" for example in examples)

    async def write_jsonl(
        self,
        path: Path | str,
        format: ExportFormat | str,
        entity_path: str | None = None,
        limit: int | None = None,
        progress: Progress | None = None,
        *,
        root: Path | None = None,
    ) -> ExportResult:
        """Stream the examples to `path` as JSONL, one line at a time; the file appears only when complete.

        With `root`, `path` is relative to it and no symlink below `root` is followed (see `_open_beneath`),
        so a name handed in by a client cannot write outside `root`."""
        report = progress or no_progress
        report(0, 3, "reading the outcome history")
        fmt, history, entity_path, limit = await self._prepare(format, entity_path, limit)
        if root is None:
            root, relative = Path(path).parent, PurePath(Path(path).name)
        else:
            relative = PurePath(path)
        target = root / relative
        report(1, 3, f"writing {fmt.value} examples")

        def write() -> int:
            count = 0
            examples = self._generate(fmt, history, entity_path)
            first = next(examples, None)
            if first is None:
                raise self._missing(fmt, history, entity_path)
            name, partial = relative.name, relative.name + ".partial"
            sources, sources_partial = name + SOURCES_SUFFIX, name + SOURCES_SUFFIX + ".partial"
            if name in (EXPORTS_LOCK, EXPORTS_PENDING) or name.endswith((SOURCES_SUFFIX, ".partial", ".scrub")):
                # These names are the exports' own bookkeeping: taking one over would hide an export from the scrub
                # (its sources file replaced) or unlock it.
                raise ValidationError(
                    f"output_path: {name!r} is a name the exports keep for their own files (ending in "
                    f"{SOURCES_SUFFIX}, .partial or .scrub, or {EXPORTS_LOCK} or {EXPORTS_PENDING}); pick another, e.g. train.jsonl. "
                    "Nothing was written.")
            longest = len(sources_partial.encode("utf-8"))
            if longest > NAME_MAX_BYTES:
                # Too long for the file system with the suffixes its bookkeeping files add; the failure to open one
                # read as "another export is being written" (red-team finding, 0.7.15).
                spare = NAME_MAX_BYTES - (longest - len(name.encode("utf-8")))
                raise ValidationError(
                    f"output_path: the file name is {len(name.encode('utf-8'))} bytes; with the suffixes of the files "
                    f"kept beside it it must stay within {spare} bytes. Nothing was written.")
            try:
                folder = _open_beneath(root, relative.parts[:-1])

                def drop_partials() -> None:
                    # Each only when no live export holds it: a file of that name may be another export's.
                    for leftover in (partial, sources_partial):
                        remove_if_abandoned(leftover, folder)  # a planted link is removed, its target untouched

                try:
                    # A leftover of a killed export goes; one a live export is writing is refused, not taken over.
                    if not all(remove_if_abandoned(leftover, folder) for leftover in (partial, sources_partial)):
                        raise ValidationError(
                            f"output_path: another export to {target} is being written right now; wait for it to "
                            "finish or pick another name. Nothing was written.")
                    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                    unhanded: list[int] = []  # opened, not yet closed by the `with` below
                    try:
                        fd = os.open(partial, flags, 0o644, dir_fd=folder)
                        unhanded.append(fd)
                        hold_while_open(fd)  # a scrub removes .partial files no live writer holds
                        sources_fd = os.open(sources_partial, flags, 0o644, dir_fd=folder)
                        unhanded.append(sources_fd)
                        hold_while_open(sources_fd)
                        unhanded.clear()
                        with os.fdopen(fd, "w", encoding="utf-8") as handle, \
                                os.fdopen(sources_fd, "w", encoding="utf-8") as sources_handle:
                            for example in islice(_chain(first, examples), limit):
                                made_from = example.pop(SOURCES)
                                handle.write(json.dumps(example, ensure_ascii=False) + "\n")
                                sources_handle.write(json.dumps(made_from, ensure_ascii=False) + "\n")
                                count += 1
                            for written in (handle, sources_handle):
                                written.flush()
                                os.fsync(written.fileno())
                            # rename(2) replaces a link at `name` itself, never what it points to. Renamed while
                            # still held, under the exports' lock: no scrub sees the pair half renamed.
                            _replace_pair(root, relative, (
                                lambda: os.replace(partial, name, src_dir_fd=folder, dst_dir_fd=folder),
                                lambda: os.replace(sources_partial, sources, src_dir_fd=folder, dst_dir_fd=folder)))
                    except BaseException:
                        # A failed write (the name is a folder, the disk is full) leaves no half export behind: the
                        # scrub does not read .partial files that a live export holds.
                        for opened in unhanded:
                            os.close(opened)
                        drop_partials()
                        raise
                finally:
                    os.close(folder)
            except OSError as error:
                raise StoreError(f"Cannot write the export to {target}: {error}.") from error
            return count

        count = await asyncio.to_thread(write)
        report(3, 3, f"wrote {count} examples")
        return ExportResult(fmt.value, count, [], _now(), str(target))

    # -- building -----------------------------------------------------------------------------

    async def _prepare(
        self, format: ExportFormat | str, entity_path: str | None, limit: int | None
    ) -> tuple[ExportFormat, OutcomeHistory, str | None, int | None]:
        fmt = resolve_format(format)
        entity_path = v.validate_entity_prefix(entity_path)
        if limit is not None:
            limit = v.validate_limit(limit, maximum=1_000_000)
        return fmt, await OutcomeHistory.load(self.service, entity_path), entity_path, limit

    async def _examples(
        self, format: ExportFormat | str, entity_path: str | None, limit: int | None
    ) -> tuple[ExportFormat, list[dict[str, Any]]]:
        fmt, history, entity_path, limit = await self._prepare(format, entity_path, limit)
        examples = await asyncio.to_thread(
            lambda: [_without_sources(e) for e in islice(self._generate(fmt, history, entity_path), limit)])
        if not examples:
            raise self._missing(fmt, history, entity_path)
        return fmt, examples

    def _generate(self, fmt: ExportFormat, history: OutcomeHistory, entity_path: str | None) -> Iterator[dict[str, Any]]:
        if fmt is ExportFormat.SFT:
            return self._sft(history, entity_path)
        if fmt is ExportFormat.DPO:
            return self._dpo(history, entity_path)
        return self._reward(history, entity_path)

    def _sft(self, history: OutcomeHistory, entity_path: str | None) -> Iterator[dict[str, Any]]:
        for trace in history.traces(entity_path):
            if not trace.clean or not trace.decisions:
                continue
            context = _versions(history, trace.context)
            decisions_found = _versions(history, trace.decisions)
            if len(context) < 2 or not decisions_found:
                continue
            yield {
                "messages": [
                    {"role": "system", "content": SFT_SYSTEM},
                    {"role": "user", "content": _context_prompt(context, trace)},
                    {"role": "assistant", "content": _decision_text(decisions_found)},
                ],
                SOURCES: _sources([*context, *decisions_found]),
            }

    def _dpo(self, history: OutcomeHistory, entity_path: str | None) -> Iterator[dict[str, Any]]:
        clean, failed = self._traces_by_entity(history, entity_path)
        for entity in sorted(set(clean) & set(failed)):
            good, bad = clean[entity], failed[entity]
            for index in range(max(len(good), len(bad))):
                chosen, rejected = good[index % len(good)], bad[index % len(bad)]
                chosen_context, rejected_context = _versions(history, chosen.context), _versions(history, rejected.context)
                candidates = {e.entry_key: e for e in [*chosen_context, *rejected_context]}
                listed = [candidates[k] for k in sorted(candidates)][:MAX_DPO_CANDIDATES]
                prompt = (
                    f"Task on '{entity}'. Candidate memories:\n{_numbered(listed)}\n\n"
                    "Which memories do you rely on, and what do you decide?"
                )
                yield {
                    "prompt": [{"role": "system", "content": DPO_SYSTEM}, {"role": "user", "content": prompt}],
                    "chosen": [{"role": "assistant", "content": _answer(history, chosen, chosen_context)}],
                    "rejected": [{"role": "assistant", "content": _answer(history, rejected, rejected_context)}],
                    SOURCES: _sources([*listed, *chosen_context, *rejected_context,
                                       *_versions(history, chosen.decisions), *_versions(history, rejected.decisions)]),
                }

    def _traces_by_entity(
        self, history: OutcomeHistory, entity_path: str | None
    ) -> tuple[dict[str, list[DecisionTrace]], dict[str, list[DecisionTrace]]]:
        clean: dict[str, list[DecisionTrace]] = defaultdict(list)
        failed: dict[str, list[DecisionTrace]] = defaultdict(list)
        for trace in history.traces(entity_path):
            if not trace.context:
                continue
            for entity in trace.entity_paths:
                if under(entity, entity_path):
                    (failed if trace.failed else clean)[entity].append(trace)
        return clean, failed

    def _reward(self, history: OutcomeHistory, entity_path: str | None) -> Iterator[dict[str, Any]]:
        for key in sorted(history.effects_by_entry):
            links = history.effects_by_entry[key]
            if not under(links[0][1].entity_path, entity_path):
                continue
            entry = _latest(history, links[0][1].entity_path, links[0][1].key)
            if entry is None:
                continue
            types = [record.outcome_type for record, _ in links]
            counts = Counter(types)
            top = max(counts.values())
            # Most frequent outcome type; a tie goes to the most recent of the tied types.
            dominant = next(t for t in reversed(types) if counts[t] == top)
            data = entry.to_dict(include_embedding=False)
            data.pop("embedding", None)
            yield {
                "entry": data,
                "label": round(sum(REWARD_LABELS[t] for t in types) / len(types), 4),
                "outcome_type": dominant.value,
                "outcome_count": len(types),
                SOURCES: _sources([entry]),
            }

    def _missing(self, fmt: ExportFormat, history: OutcomeHistory, entity_path: str | None) -> InsufficientDataError:
        scope = f" under '{entity_path}'" if entity_path else ""
        outcomes = [o for o in history.outcomes if any(under(e.entity_path, entity_path) for e in o.effects)]
        hint = "Commit outcomes with amfs_commit_outcome after sessions that read (amfs_read/amfs_retrieve) and write."
        if fmt is ExportFormat.REWARD_MODEL:
            return InsufficientDataError(
                f"Reward-model export needs at least 1 outcome-linked entry{scope}; found {len(outcomes)} outcomes "
                f"linking none. {hint}"
            )
        traces = history.traces(entity_path)
        if fmt is ExportFormat.SFT:
            clean = [t for t in traces if t.clean]
            with_reads = [t for t in clean if len(t.context) >= 2]
            with_write = [t for t in with_reads if t.decisions]
            return InsufficientDataError(
                f"SFT export needs at least 1 clean outcome (success) whose session read 2+ entries and wrote a "
                f"decision{scope}; found {len(outcomes)} outcomes, {len(clean)} clean traces, {len(with_reads)} of "
                f"them with 2+ entries read, {len(with_write)} of those with a write. {hint}"
            )
        clean, failed = self._traces_by_entity(history, entity_path)
        only_clean = sorted(set(clean) - set(failed))[:5]
        only_failed = sorted(set(failed) - set(clean))[:5]
        return InsufficientDataError(
            f"DPO export needs, for one entity, at least 1 clean (success) trace and 1 failed (incident) trace"
            f"{scope}; no entity has both (entities with only clean traces: {only_clean or 'none'}; only failed: "
            f"{only_failed or 'none'}). {hint}"
        )


def _open_beneath(root: Path, folders: tuple[str, ...], create: bool = True) -> int:
    """A descriptor of `root/folders...`, created as needed (with `create`), reached one component at a time with
    O_NOFOLLOW: a symlinked (or swapped-in) directory below `root` is refused, never followed."""
    if create:
        root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in folders:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=fd)
            try:
                child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as error:
                if error.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise ValidationError(
                        f"output_path: {part!r} under {root} is a symbolic link or a file, not a folder; exports "
                        "never follow links. Pick another name; nothing was written."
                    ) from None
                raise
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _chain(first: dict[str, Any], rest: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    yield first
    yield from rest


def _now() -> str:
    return utcnow().strftime("%Y-%m-%dT%H:%M:%SZ")


# Each example is built with the memory versions it was made from; a file export writes them, line for line, to a
# sources file beside it (`train.jsonl` -> `train.jsonl.amfs-sources`), never into the example: OpenAI fine-tuning
# refuses other top-level keys. `scrub_exports` takes the examples made from what the store no longer holds out of
# the export files under the export folder (`follow_erasures` wires it to every front end's erases).
logger = logging.getLogger(__name__)
SOURCES = "amfs_sources"
SOURCES_SUFFIX = ".amfs-sources"
EXPORTS_LOCK = ".amfs-exports.lock"
EXPORTS_PENDING = ".amfs-exports.pending"
NAME_MAX_BYTES = 255  # a file name's longest on Linux, macOS and Windows file systems


# A memory version an example was made from: (entry key, version, when that version was written). The write
# time tells a version from a later one with the same number: a key forgotten (or expired) and written again starts
# over at version 1, and by key and number alone the scrub took the new v1 for the erased one and kept its examples.
Source = tuple[str, int, str | None]


def _sources(entries: list[MemoryEntry]) -> list[list[Any]]:
    sources = {(e.entry_key, e.version, e.provenance.written_at.isoformat()) for e in entries}
    return [list(source) for source in sorted(sources)]


def _without_sources(example: dict[str, Any]) -> dict[str, Any]:
    example.pop(SOURCES, None)
    return example


def export_files(root: Path) -> list[Path]:
    """The exports under `root` that have a sources file, whatever their names (links not followed: a client names
    files, never where they point)."""
    if not root.is_dir():
        return []
    found = []
    for sources in root.rglob("*" + SOURCES_SUFFIX):
        export = sources.with_name(sources.name[: -len(SOURCES_SUFFIX)])
        if all(p.is_file() and not p.is_symlink() for p in (sources, export)):
            found.append(export)
    return sorted(found)


def _replace_pair(root: Path, export: PurePath, renames: tuple[Callable[[], None], Callable[[], None]],
                  locked: bool = False) -> None:
    """The two renames that put an export and its sources file in place, under the exports' lock (unless the caller
    holds it) and a mark in `root` naming the export between the first and the second. A process killed in between
    left a new export beside an old or missing sources file, which the scrub could not check or did not see at all,
    so a memory forgotten later stayed in it (red-team finding, 0.7.13); the next scrub finds the mark and deletes
    that export and its sources file (`_remove_leftovers`)."""
    lock = None if locked else acquire_exclusive(root / EXPORTS_LOCK, "the training exports")
    try:
        _settle_pending(root)  # one mark at a time: a killed process's is dealt with before it is replaced
        mark = root / EXPORTS_PENDING
        with _create(mark) as handle:
            handle.write(export.as_posix())
            handle.flush()
            os.fsync(handle.fileno())
        try:
            renames[0]()
        except BaseException:
            mark.unlink()  # nothing was replaced
            raise
        renames[1]()  # should this fail, the mark stays: the pair is half replaced
        mark.unlink()
    finally:
        if lock is not None:
            lock.close()


def _remove_leftovers(root: Path) -> None:
    """What killed processes left under `root` (the exports' lock held): the export a mark names (its renames may be
    half done), `.scrub` temporaries (scrubs hold the lock: every one is a leftover), and `.partial` files no live
    export holds. Each may hold examples of memories forgotten since."""
    _settle_pending(root)
    for leftover in root.rglob(".*.scrub"):
        _delete(leftover, "left by a scrub that was stopped")
    for leftover in root.rglob("*.partial"):
        if remove_if_abandoned(leftover):
            logger.warning("Deleted %s, left by an export that was stopped while writing it", leftover)


def _settle_pending(root: Path) -> None:
    """The exports' lock held: delete the export a mark names, and its sources file (a process stopped between
    their renames), reached without following a link below `root`; then the mark."""
    mark = root / EXPORTS_PENDING
    if not mark.is_file() or mark.is_symlink():
        if mark.is_symlink():
            mark.unlink()
        return
    named = PurePath(mark.read_text(encoding="utf-8", errors="replace"))
    if named.parts and not named.is_absolute() and ".." not in named.parts:
        try:
            folder = _open_beneath(root, named.parts[:-1], create=False)
        except (ValidationError, OSError) as error:
            logger.warning("Not deleting %s, named by %s: %s", named, mark, error)
        else:
            try:
                for name in (named.name, named.name + SOURCES_SUFFIX):
                    logger.warning("Deleting %s: a process stopped while replacing it, so it cannot be checked for "
                                   "erased memories (export again)", root / named.parent / name)
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(name, dir_fd=folder)  # a link is removed, never followed
            except OSError as error:  # a folder of that name, say: the scrub goes on
                logger.warning("Could not delete %s: %s", root / named, error)
            finally:
                os.close(folder)
    mark.unlink()


def _delete(path: Path, why: str) -> None:
    if path.is_symlink() or path.is_file():
        logger.warning("Deleting %s: %s", path, why)
        try:
            path.unlink()
        except OSError as error:  # a scrub that stops here would leave every other export unscrubbed
            logger.warning("Could not delete %s: %s", path, error)


def _sources_file(path: Path) -> Path:
    return path.with_name(path.name + SOURCES_SUFFIX)


def _create(path: Path, errors: str = "strict") -> IO[str]:
    """A new file at `path` for writing; whatever is there (a leftover, a planted link) goes first and no link is
    followed (red-team repro: a link planted at the scrub's temporary name made it write outside the folder)."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    return os.fdopen(fd, "w", encoding="utf-8", errors=errors)


async def scrub_exports(service: MemoryService, root: Path) -> int:
    """Take out of every export under `root` the examples made from a memory version the store no longer holds;
    returns how many went. Runs after each forget, TTL expiry and clear, when a store is opened (what others
    erased meanwhile, or a process stopped before its scrub), and after each file export (an export that read a
    memory before a forget committed and finished after its scrub). One process at a time (a lock in `root`),
    each distinct version looked up once. Exports without a matching sources file are left alone and logged."""
    if not root.is_dir():
        return 0
    lock = await asyncio.to_thread(acquire_exclusive, root / EXPORTS_LOCK, "the training exports")
    try:
        await asyncio.to_thread(_remove_leftovers, root)
        files = await asyncio.to_thread(export_files, root)
        made_from: dict[Path, set[Source]] = {}
        for path in files:
            sources = await asyncio.to_thread(sources_in, path)
            if sources is None:
                logger.warning("%s does not match its sources file line for line; it was not checked for erased "
                               "memories (delete it or export again)", path)
            else:
                made_from[path] = sources
        wanted = set().union(*made_from.values()) if made_from else set()
        alive = {source for source in wanted if await _holds(service, *source)}
        dropped = 0
        for path, sources in made_from.items():
            if not sources <= alive:
                dropped += await asyncio.to_thread(drop_dead_examples, path, alive, root)
        return dropped
    finally:
        if lock is not None:
            lock.close()


async def _holds(service: MemoryService, entry_key: str, version: int, written_at: str | None) -> bool:
    try:
        entity_path, key = split_entry_key(entry_key)
    except ValidationError:
        return False
    held = await service.store.get_version(entity_path, key, version)
    if held is None or written_at is None:  # None: a sources file written before 0.7.14 named no write time
        return held is not None
    try:
        return held.provenance.written_at == datetime.fromisoformat(written_at)
    except ValueError:
        return False


def follow_erasures(service: MemoryService, root: Path) -> None:
    """Keep the exports under `root` free of what `service` erases (the composition root calls this for every
    front end: the servers, the memory browser, the CLI and the SDK)."""

    async def scrub() -> None:
        await scrub_exports(service, root)

    service.after_erase(scrub)


def _read_sources(line: str) -> set[Source]:
    return {(str(source[0]), int(source[1]), str(source[2]) if len(source) > 2 else None)
            for source in json.loads(line)}


# What each export file was read as, by the files' size and time: the expiry sweep scrubs every minute, and an
# export that did not change is not read again (the store may have, so its versions are still looked up each time).
_read_as: dict[Path, tuple[tuple[int, ...], set[Source] | None]] = {}


def sources_in(path: Path) -> set[Source] | None:
    """The memory versions the examples of one export file were made from; None when its sources file does not
    match it line for line (a crash between the two renames, an edited file): such a file is left alone."""
    try:
        stamp = tuple(n for p in (path, _sources_file(path)) for n in (p.stat().st_mtime_ns, p.stat().st_size))
    except OSError:
        return None
    if (known := _read_as.get(path)) is not None and known[0] == stamp:
        return known[1]
    found: set[Source] = set()
    matched = False
    try:
        with open(path, "rb") as examples, open(_sources_file(path), encoding="utf-8") as sources:
            lines = sum(1 for _ in examples)
            count = 0
            for line in sources:
                found |= _read_sources(line)
                count += 1
        matched = count == lines
    except (OSError, ValueError, TypeError):
        pass
    _read_as[path] = (stamp, found if matched else None)
    return _read_as[path][1]


def drop_dead_examples(path: Path, alive: set[Source], root: Path) -> int:
    """Rewrite the file and its sources file (an export under `root`, whose lock the caller holds) without the
    examples made from a version not in `alive`, streaming through temporary files renamed over them
    (`_replace_pair`). Returns how many examples went."""
    sources = _sources_file(path)
    partial, sources_partial = (p.with_name(f".{p.name}.{os.getpid()}.scrub") for p in (path, sources))
    dropped = 0
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as examples, \
                open(sources, encoding="utf-8") as made_from, \
                _create(partial, errors="surrogateescape") as out, _create(sources_partial) as sources_out:
            for example, line in zip(examples, made_from):
                if _read_sources(line) <= alive:
                    out.write(example)
                    sources_out.write(line)
                else:
                    dropped += 1
            for handle in (out, sources_out):
                handle.flush()
                os.fsync(handle.fileno())
        if dropped:
            _replace_pair(root, path.relative_to(root), (lambda: os.replace(partial, path),
                                                         lambda: os.replace(sources_partial, sources)), locked=True)
    finally:
        partial.unlink(missing_ok=True)
        sources_partial.unlink(missing_ok=True)
    return dropped


def _versions(history: OutcomeHistory, items: list[TraceRead] | list[TraceWrite]) -> list[MemoryEntry]:
    """The entry versions a trace saw or wrote, as they were at that moment (confidence then, not now)."""
    found = [(history.version(i.entity_path, i.key, i.version), i.at) for i in items]
    return [history.as_of(entry, at) for entry, at in found if entry is not None]


def _latest(history: OutcomeHistory, entity_path: str, key: str) -> MemoryEntry | None:
    versions = [e for (p, k, _), e in history.versions.items() if p == entity_path and k == key]
    return max(versions, key=lambda e: e.version) if versions else None


def _value_text(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)
    return text if len(text) <= MAX_VALUE_CHARS else text[:MAX_VALUE_CHARS] + "…"


def _describe(entry: MemoryEntry) -> str:
    return (
        f"{entry.entry_key} (v{entry.version}, {entry.memory_type.value}, confidence {entry.confidence:.2f}): "
        f"{_value_text(entry.value)}"
    )


def _numbered(entries: list[MemoryEntry]) -> str:
    return "\n".join(f"{i}. {_describe(e)}" for i, e in enumerate(entries, start=1))


def _context_prompt(context: list[MemoryEntry], trace: DecisionTrace) -> str:
    entities = ", ".join(sorted({d.entity_path for d in trace.decisions}))
    return f"Memories read:\n{_numbered(context)}\n\nRecord your decision for {entities}."


def _decision_text(decisions: list[MemoryEntry]) -> str:
    writes = [
        {"entity_path": d.entity_path, "key": d.key, "value": d.value, "memory_type": d.memory_type.value,
         "confidence": d.confidence}
        for d in decisions
    ]
    return json.dumps(writes[0] if len(writes) == 1 else writes, ensure_ascii=False, sort_keys=True)


def _answer(history: OutcomeHistory, trace: DecisionTrace, context: list[MemoryEntry]) -> str:
    relied = "\n".join(f"- {e.entry_key} (v{e.version})" for e in context) or "- none"
    found = _versions(history, trace.decisions)
    decided = _decision_text(found) if found else "No memory written."
    return f"Relied on:\n{relied}\nDecision: {decided}"
