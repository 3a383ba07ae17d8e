"""MemoryService: the one API every front end (MCP tools, SDK, CLI) calls.

It validates input, applies the domain rules (versions, outcomes, decay, tiers) and talks to a
`MemoryStore`. It holds no per-session state: the caller passes an `Actor` with every call, so one
service serves many MCP sessions.
"""

from __future__ import annotations

import asyncio
import builtins  # MemoryService.list shadows `list` in annotations inside the class body
import logging
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, TypeVar

from .ports import IMPORT_PENDING_META, Embedder, MemoryStore, OutcomeTarget, StoreSnapshot, TierUpdate, vector_widths
from . import validation as v
from .confidence import DEFAULT_MULTIPLIERS, effective_confidence, validate_multipliers
from .embedding import (
    EMBEDDER_META as EMBEDDER_META,
    ENTRY_VECTORS,
    PASSAGE_SHARE,
    TORCH_MINILM,
    Context,
    EntryVectors,
    context_passages,
    embed_entries,
    embed_queries,
    entry_texts,
    embedding_text,
    entry_similarity,
    passage_questions,
    keep_or_reembed,
)
from .errors import ConflictError, NotFoundError, StorageFullError, StoreError, ValidationError
from .models import (
    Actor,
    EntryFilter,
    MemoryEntry,
    MemoryType,
    NewEntry,
    OutcomeRecord,
    OutcomeType,
    SortBy,
    Tier,
    TraceEvent,
    TraceKind,
    ValueHead,
    split_entry_key,
    under,
    utcnow,
)
from .retrieval import (
    speaker_label,
    speaker_matches,
    DEFAULT_RRF_K,
    FUSIONS,
    LearnedScorer,
    RankedList,
    RetrievedEntry,
    fuse,
    fuse_hybrid,
    NEAR_COPY_MAX_CHARS,
    near_copies,
    visible_text,
    keyword_terms,
    recency_bucket,
    resolve_weights,
)
from .tiers import priority_score, tier_for

logger = logging.getLogger("amfs_server.core.service")
T = TypeVar("T")

MAX_QUERY_CHARS = 2000
MAX_HISTORY_PAGE = 1000  # versions per amfs_history call: a long history is read in pages, never whole
# With min_confidence or depth, how many candidates each search may look through for entries that pass: past it
# a retrieve would cost a scan of the store, so an entry that about 12,800 failing ones outrank is not found.
FILTERED_POOL_MAX = 12_800
# A retrieval reads its candidates' values up to this many characters of JSON, longer ones as a `ValueHead`, so 100
# candidates of 1 MiB are not read to return ten (0.7.12). Copies, near copies and the speaker label are decided
# within it as whole values would decide them (a string longer than NEAR_COPY_MAX_CHARS is never a near copy; its
# head holds at least that many characters); the question discount (`passage_questions`) is not given to a value
# read by its head.
RANK_VALUE_HEAD = ValueHead.enough_for(NEAR_COPY_MAX_CHARS)

MULTIPLIERS_META = "outcome_multipliers"


def scoped_outcome_ref(scope: str | None, outcome_ref: str) -> str:
    """The ref as stored: a prefix-scoped caller's refs live under `@PREFIX#`, so the store's one-per-ref
    rule becomes one per (scope, ref). `#` cannot occur in an entity path, so no two scopes share a
    namespace. Unscoped refs are stored as given (an unscoped key can name a scope's ref in full:
    `@team-a#INC-1`)."""
    return outcome_ref if scope is None else f"@{scope}#{outcome_ref}"


def unscoped_outcome_ref(stored: str) -> str:
    """The ref as its caller gave it (`@team-a#INC-1` -> `INC-1`): the inverse of `scoped_outcome_ref`."""
    return stored.partition("#")[2] if stored.startswith("@") and "#" in stored else stored


ENTRY_VECTORS_META = "entry_vectors"  # how those vectors were made from entry texts (embedding.ENTRY_VECTORS)
# A store's vectors and the configured embedder's agree to this cosine when they come from the same model and
# runtime (int8 ONNX is deterministic per text); torch and int8 MiniLM agree only to ~0.99 and do not mix.
SAME_EMBEDDER_COSINE = 0.999
SORT_CHOICES: tuple[str, ...] = ("confidence", "recency", "recall_count", "priority")
# How often a running server erases the memories whose TTL has passed (every version, as forget does); reads and
# exports hide them in between, so the interval bounds only how long their bytes stay on disk.
EXPIRY_SWEEP_S = 60.0


@dataclass(frozen=True)
class WriteRequest:
    entity_path: str
    key: str
    value: Any
    confidence: float = 1.0
    memory_type: MemoryType | str = MemoryType.FACT
    ttl_seconds: float | None = None
    ttl_at: datetime | None = None
    importance_score: float | None = None
    importance_dimensions: dict[str, float] | None = None
    # When the event happened: ISO 8601 date or datetime text, or a datetime/date (see validation.validate_event_time).
    event_at: datetime | str | None = None


@dataclass
class ServiceConfig:
    decay_half_life_days: float | None = None
    max_value_bytes: int = v.DEFAULT_MAX_VALUE_BYTES
    multipliers: dict[OutcomeType, float] = field(default_factory=lambda: dict(DEFAULT_MULTIPLIERS))
    retrieval_weights: dict[str, float] | None = None
    # "hybrid" (score-aware, the default) or "rrf" (the seed's weighted RRF 0.4/0.2/0.2/0.2): core/retrieval.py.
    fusion: str = "hybrid"
    rrf_k: int = DEFAULT_RRF_K
    candidate_pool: int = 50
    # How much of an entry's semantic score comes from its best sentence rather than its mean vector
    # (core/embedding.py entry_similarity; 0 turns the second look off).
    passage_share: float = PASSAGE_SHARE
    # Query-blind strategies (temporal, confidence, learned) and the speaker rule re-order only the entries within this many
    # top places of the semantic or keyword list: they decide among relevant candidates, never bring in new ones.
    rerank_pool: int = 10
    # rrf only: keyword hits scoring below this fraction of the best hit match only incidental words of the
    # question; they are dropped so they cannot outvote the semantic ranking (hybrid weighs them by score instead).
    keyword_min_relative_score: float = 0.7
    # A word found in more entries than this says little about any one of them (its IDF is near zero), and
    # scoring every entry it matches is what makes keyword search slow at scale: such words are left to
    # semantic search.
    keyword_max_term_matches: int = 1000


# How earlier releases made a store's vectors (ENTRY_VECTORS_META), as the refusal to open such a store names them.
PREVIOUS_ENTRY_VECTORS = {
    "sentence-mean": "without the sentence vectors this one also keeps",
    "sentence-mean+passages": "with transcript turns embedded under their entity path and key",
    "sentence-mean+passages+turn-header": "with the vector of a several-sentence entry made of its sentences alone",
}


class MemoryService:
    def __init__(
        self,
        store: MemoryStore,
        config: ServiceConfig | None = None,
        embedder: Embedder | None = None,
        *,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self.store = store
        self._clock = clock
        self.config = config or ServiceConfig()
        if self.config.decay_half_life_days is not None and not self.config.decay_half_life_days > 0:
            raise ValidationError("decay_half_life_days must be > 0 when set.")
        self.embedder = embedder
        self._calibrated_multipliers: dict[OutcomeType, float] | None = None
        self._expiry_sweeps: asyncio.Task[None] | None = None
        self._erase_listeners: builtins.list[Callable[[], Awaitable[Any]]] = []
        self._erasing: set[asyncio.Future[Any]] = set()  # erases whose caller was cancelled, still running
        self.learned_scorer: LearnedScorer | None = None
        self._learned_covers: Callable[[str | None], bool] | None = None
        self._write_order: dict[str, tuple[asyncio.Lock, list[int]]] = {}  # per entity path: its lock, its users
        if self.config.fusion not in FUSIONS:
            raise ValidationError(f"Unknown fusion {self.config.fusion!r}; use one of {list(FUSIONS)}.")
        resolve_weights(self.config.retrieval_weights, learned_available=False)  # fail fast on bad weights
        share = self.config.passage_share
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0.0 <= share <= 1.0:
            raise ValidationError(f"passage_share must be between 0 and 1, got {self.config.passage_share!r}.")

    def now(self) -> datetime:
        """The service's clock: the one it was given, else the wall clock (looked up at each call)."""
        return self._clock() if self._clock is not None else utcnow()

    async def open(self, *, check_embedder: bool = True) -> None:
        """`check_embedder=False`: opened to be re-embedded (`reembed`), so the store's vectors need not be the
        configured embedder's, in name or in width."""
        await self.store.open(reembedding=not check_embedder)
        if not await self.purge_expired():  # what expired while nothing ran is erased before anything reads
            await self._erased()  # copies follow what others erased, or what a process stopped before following
        await self.refresh_calibrated_multipliers()
        if check_embedder:
            await self._check_embedder()

    async def _check_embedder(self) -> None:
        """Refuse a store whose vectors another embedder made: they are not comparable with this one's queries.

        The store's meta names its embedder and how entry vectors were made from texts (`ENTRY_VECTORS_META`).
        A store without the embedder record (written before it existed, or cleared since) is checked by
        re-embedding a few stored texts: if their vectors match, the record is written. A store of the same
        embedder's vectors made another way by an earlier release (whole entries; sentence means without the
        sentence vectors) is refused with the re-embed command.
        """
        if self.embedder is None:
            return
        recorded = await self.store.get_meta(EMBEDDER_META)
        scheme = await self.store.get_meta(ENTRY_VECTORS_META)
        if recorded is None:
            recorded, scheme = await self._identify_stored_embedder(self.embedder)
            if recorded is None or (recorded == self.embedder.name and scheme == ENTRY_VECTORS):
                await self._record_embedder()
                return
        if recorded == self.embedder.name and scheme != ENTRY_VECTORS:
            if not await self._has_vectors():
                await self._record_embedder()
                return
            made = PREVIOUS_ENTRY_VECTORS.get(scheme or "", "from whole entries")
            raise StoreError(
                f"This store's vectors were made by {recorded!r} {made}, by an earlier amfs-server; this "
                "one embeds entries whole and sentence by sentence, transcript turns under a fixed header "
                f"({ENTRY_VECTORS}), and the two do not mix, so nothing was changed. Re-embed the store once: "
                "`amfs-server memory reembed` (every version, a few ms each)."
            )
        if recorded != self.embedder.name:
            raise StoreError(
                f"This store's vectors were made by the embedder {recorded!r}, but the server is configured for "
                f"{self.embedder.name!r}; their vectors are not comparable, so nothing was changed. "
                f"{keep_or_reembed(recorded)}."
            )

    async def _record_embedder(self) -> None:
        assert self.embedder is not None
        await self.store.set_meta(EMBEDDER_META, self.embedder.name)
        await self.store.set_meta(ENTRY_VECTORS_META, ENTRY_VECTORS)

    async def _has_vectors(self) -> bool:
        assert self.embedder is not None
        probe = [1.0] + [0.0] * (self.embedder.dimension - 1)
        return bool(await self.store.semantic_candidates(probe, EntryFilter(), self.now(), 1))

    async def _entry_vectors(
        self, entries: Sequence[tuple[str, str, Any, datetime | None]], contexts: Sequence[Context] | None = None,
    ) -> EntryVectors:
        """Per (entity_path, key, value, event_at): its vector, made of its whole text's and its sentences'
        embeddings, and the embeddings its best-sentence look scores, its context passage's included (see
        `entry_texts`, `context_passage`, `embed_entries`). Runs the embedder in a thread."""
        assert self.embedder is not None
        texts = [entry_texts(*entry) for entry in entries]
        context_texts = None if contexts is None else [None if context is None else context[0] for context in contexts]
        return await asyncio.to_thread(embed_entries, self.embedder.embed, texts, context_texts)

    async def _contexts_of_drafts(self, drafts: Sequence[NewEntry]) -> list[Context]:
        """Each draft's context passage (`context_passages`): a batch shares one written_at, so its drafts count as
        written in key order, as the stores insert them and as `reembed` rebuilds them; before them, a path holds
        what the store has there (its two newest: the draft's own key may be one). Paths without a transcript
        turn among the drafts are not looked up."""
        now = self.now()
        paths = {d.entity_path for d in drafts if speaker_label(d.value) is not None}
        before = {path: [(e.key, e.value, e.ttl_at is not None) for e in reversed(await self.store.latest_at(path, now, 2))]
                  for path in paths}
        order = sorted(range(len(drafts)), key=lambda i: (drafts[i].entity_path, drafts[i].key))
        return context_passages([(d.entity_path, d.key, d.value, d.event_at) for d in drafts], order, before,
                                [d.ttl_at is not None for d in drafts])

    @staticmethod
    def _vector_fields(made: EntryVectors, contexts: Sequence[Context]) -> list[dict[str, Any]]:
        """What `made` and `contexts` give each entry or draft: its vector, passage embeddings and context key."""
        return [
            {"embedding": vector.tolist(), "passage_embeddings": None if passages is None else passages.tolist(),
             "context_key": None if context is None else context[1]}
            for vector, passages, context in zip(made.vectors, made.passages, contexts)
        ]

    async def _identify_stored_embedder(self, embedder: Embedder) -> tuple[str | None, str | None]:
        """(None, None) for a store without vectors; the configured embedder's name and the way its vectors
        were made when stored vectors match it; otherwise a description of the unknown embedder."""
        import numpy as np

        probe = [1.0] + [0.0] * (embedder.dimension - 1)
        now = self.now()
        found = await self.store.semantic_candidates(probe, EntryFilter(), now, 3)
        current = [await self.store.get_current(e.entity_path, e.key, now) for e, _ in found]
        stored = [e for e in current if e is not None and e.embedding is not None]
        if not stored:
            return None, None
        old = np.asarray([e.embedding for e in stored], dtype=np.float32)

        def matches(fresh: Any) -> bool:
            return bool(old.shape == fresh.shape and float((old * fresh).sum(axis=1).min()) >= SAME_EMBEDDER_COSINE)

        fresh = await self._entry_vectors([(e.entity_path, e.key, e.value, e.event_at) for e in stored])
        if matches(fresh.vectors):
            # The same vectors; a store of the release before passage vectors lacks them where several are due.
            due = [e for e, passages in zip(stored, fresh.passages) if passages is not None]
            kept = await self.store.passage_vectors(due)
            return embedder.name, (ENTRY_VECTORS if len(kept) == len(due) else "sentence-mean")
        whole = [embedding_text(e.entity_path, e.key, e.value, e.event_at) for e in stored]
        if matches(await asyncio.to_thread(embedder.embed, whole)):
            return embedder.name, "whole-entry"  # an earlier amfs-server's vectors
        # Before the store recorded its embedder, the default was the torch MiniLM.
        return (TORCH_MINILM if old.shape[1] == 384 else f"unknown ({old.shape[1]} dimensions)"), None

    async def reembed(self, before_clear: Any = None) -> int:
        """Replace every version's vector with the configured embedder's and record it; returns how many.

        The store is exported, re-embedded in memory, then cleared and imported in one transaction (a crash
        leaves the old store or the new one); `before_clear` gets the original snapshot first (the CLI writes it
        to a backup file)."""
        if self.embedder is None:
            raise ValidationError("No embedder is configured (AMFS_EMBEDDER=none): there is nothing to re-embed with.")
        snapshot = await self.store.export_snapshot()
        items = [(e.entity_path, e.key, e.value, e.event_at) for e in snapshot.entries]
        # Write order: by time within a path; a batch shares one time and was inserted in key order.
        order = sorted(range(len(items)), key=lambda i: (
            items[i][0], snapshot.entries[i].provenance.written_at, items[i][1], snapshot.entries[i].version))
        contexts = context_passages(items, order, expiring=[e.ttl_at is not None for e in snapshot.entries])
        made = await self._entry_vectors(items, contexts)
        entries = [e.with_changes(**fields)
                   for e, fields in zip(snapshot.entries, self._vector_fields(made, contexts))]
        meta = {**snapshot.meta, EMBEDDER_META: self.embedder.name, ENTRY_VECTORS_META: ENTRY_VECTORS}
        if before_clear is not None:
            before_clear(snapshot)
        try:
            await self.store.import_snapshot(replace(snapshot, entries=entries, meta=meta), replacing=snapshot)
        except ConflictError:
            raise ConflictError(
                "Another process wrote to the store while it was being re-embedded, so nothing was replaced and no "
                "write was lost. Stop the servers that use this store (Claude Desktop, Cursor, other amfs-server "
                "processes) and run `amfs-server memory reembed` again."
            ) from None
        return len(entries)

    def start_expiry_sweeps(self, interval_s: float = EXPIRY_SWEEP_S) -> None:
        """Erase expired memories every `interval_s` until `close` (long-running front ends: the MCP server, the
        memory browser)."""
        if self._expiry_sweeps is None or self._expiry_sweeps.done():
            self._expiry_sweeps = asyncio.get_running_loop().create_task(self._sweep_expired(interval_s))

    async def _sweep_expired(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                removed = await self.purge_expired()
                if not removed:
                    await self._erased()  # what another process erased (one with another data dir, on PostgreSQL)
            except Exception as error:  # the next sweep retries; reads hide expired memories meanwhile
                logger.warning("Erasing expired memories failed (retried in %.0f s): %s", interval_s, error)
            else:
                if removed:
                    logger.info("Erased %d version(s) of memories whose TTL passed", removed)

    async def close(self) -> None:
        sweeps, self._expiry_sweeps = self._expiry_sweeps, None
        if sweeps is not None:
            sweeps.cancel()
            await asyncio.gather(sweeps, return_exceptions=True)
        if self._erasing:
            await asyncio.gather(*self._erasing, return_exceptions=True)
        await self.store.close()

    # -- derived values -----------------------------------------------------------------------

    def effective_confidence(self, entry: MemoryEntry, now: datetime) -> float:
        return effective_confidence(entry, now, self.config.decay_half_life_days)

    def with_current_tier(self, entry: MemoryEntry, now: datetime) -> MemoryEntry:
        score = priority_score(
            entry.provenance.written_at, now, self.effective_confidence(entry, now), entry.recall_count, entry.importance_score
        )
        return entry.with_changes(priority_score=score, tier=tier_for(score))

    @property
    def multipliers(self) -> dict[OutcomeType, float]:
        """The multipliers commit_outcome uses: calibrated ones when applied, else the configured ones."""
        return dict(self._calibrated_multipliers or self.config.multipliers)

    async def set_calibrated_multipliers(self, multipliers: Mapping[str, float] | None) -> dict[OutcomeType, float]:
        """Make calibrated multipliers the ones in force (persisted), or revert to the configured ones with None."""
        resolved = validate_multipliers(multipliers) if multipliers is not None else None
        await self.store.set_meta(MULTIPLIERS_META, {t.value: m for t, m in resolved.items()} if resolved else None)
        self._calibrated_multipliers = resolved
        return self.multipliers

    # -- ML hooks: what `ml/` needs, so it never reaches the store or assigns attributes ----------

    def install_learned_scorer(
        self, scorer: LearnedScorer | None, covers: Callable[[str | None], bool] | None = None
    ) -> None:
        """Serve `scorer` as the `learned` retrieval strategy (30% of the fusion); None turns it off. `covers` says
        for which retrievals (by their entity_path filter, None: the whole store) it takes part; omitted: all. A
        model trained for one entity must not move the weights of anyone else's retrievals."""
        self.learned_scorer = scorer
        self._learned_covers = covers

    async def refresh_calibrated_multipliers(self) -> dict[OutcomeType, float]:
        """Re-read the persisted multipliers: another process sharing the store may have applied or reverted them."""
        stored = await self.store.get_meta(MULTIPLIERS_META)
        try:
            self._calibrated_multipliers = validate_multipliers(stored) if stored else None
        except ValidationError as error:  # never lock a user out of their store: serve the defaults, say why
            logger.error("Ignoring the store's calibrated multipliers (%s); the defaults apply until amfs_calibrate "
                         "runs again.", error)
            self._calibrated_multipliers = None
        return self.multipliers

    async def trace_events(self) -> list[TraceEvent]:
        return await self.store.trace_events()

    async def entry_versions(self, entity_path: str, key: str, *, values: bool = True) -> list[MemoryEntry]:
        """Every stored version of an entry, oldest first; [] once forgotten or expired (unlike `history`, which
        raises). `values=False`: without values (None) or vectors."""
        versions = await self.store.history(entity_path, key, values=values)
        now = self.now()
        # A key whose current version's TTL passed is gone, and so is a superseded version whose own TTL passed,
        # though the next sweep has not erased them yet.
        if versions and versions[-1].is_expired(now):
            return []
        return [version for version in versions if not version.is_expired(now)]

    async def current_entries(self, entity_path: str | None = None, *, values: bool = True) -> list[MemoryEntry]:
        """Every current entry under `entity_path` (all when None), unsorted and without a limit (`values=False`:
        without their values)."""
        return await self.store.find_current(
            EntryFilter(entity_path=v.validate_entity_prefix(entity_path)), self.now(), "recency", None, values=values
        )

    async def get_shared_state(self, name: str) -> Any | None:
        """A named JSON value that lives in the store, so every process on it sees the same one (ML artifacts)."""
        return await self.store.get_meta(name)

    async def update_shared_state(
        self, names: Sequence[str], change: Callable[[dict[str, Any | None]], Mapping[str, Any | None]]
    ) -> None:
        """Named JSON values read and rewritten (`change`) in one transaction no other process's update of them
        interleaves with (`MemoryStore.update_meta`)."""
        self._check_shared_names(names)
        await self.store.update_meta(names, change)

    @staticmethod
    def _check_shared_names(names: Sequence[str]) -> None:
        if MULTIPLIERS_META in names:
            raise ValidationError(f"'{MULTIPLIERS_META}' is set through set_calibrated_multipliers, which validates it.")

    # -- writes -------------------------------------------------------------------------------

    async def write(self, actor: Actor, request: WriteRequest) -> MemoryEntry:
        return (await self.write_many(actor, [request]))[0]

    async def write_many(self, actor: Actor, requests: list[WriteRequest]) -> list[MemoryEntry]:
        """Validate every request first, embed them in one batch, then store them in one transaction."""
        now = self.now()
        drafts = [self._draft(actor, request, now) for request in requests]
        # A transcript turn borrows the turn written before it in its path (its context passage). Writes of turns to
        # one path therefore run one at a time, in the order they reached this process: a client with eight writes
        # in flight had its turns borrow the wrong ones, -0.015 recall@10 on the fresh set (an outside harness).
        turn_paths = {d.entity_path for d in drafts if speaker_label(d.value) is not None} if self.embedder else set()
        async with self._in_write_order(turn_paths):
            drafts = await self._with_embeddings(drafts)
            return await self.store.insert_versions(drafts, actor)

    @asynccontextmanager
    async def _in_write_order(self, paths: set[str]) -> AsyncIterator[None]:
        """Hold each path's lock (asyncio's are first come, first served), taken in sorted order so that two batches
        cannot wait on each other; a path's lock is dropped once no write holds or awaits it."""
        counted: builtins.list[tuple[asyncio.Lock, builtins.list[int], str]] = []
        taken: builtins.list[asyncio.Lock] = []
        try:
            for path in sorted(paths):
                lock, users = self._write_order.setdefault(path, (asyncio.Lock(), [0]))
                users[0] += 1
                counted.append((lock, users, path))
                await lock.acquire()
                taken.append(lock)
            yield
        finally:
            for lock, users, path in counted:
                if lock in taken:
                    lock.release()
                users[0] -= 1
                if not users[0]:
                    del self._write_order[path]

    def _draft(self, actor: Actor, request: WriteRequest, now: datetime) -> NewEntry:
        entity_path = v.validate_entity_path(request.entity_path)
        key = v.validate_key(request.key)
        value_json = v.serialize_value(request.value, self.config.max_value_bytes)
        confidence = v.validate_confidence(request.confidence)
        memory_type = v.validate_memory_type(request.memory_type)
        ttl_at = v.resolve_ttl(now, request.ttl_seconds, request.ttl_at)
        importance_score, importance_dimensions = v.validate_importance(
            request.importance_score, request.importance_dimensions
        )
        event_at = v.validate_event_time(request.event_at)
        score = priority_score(now, now, confidence, 0, importance_score)
        return NewEntry(
            entity_path=entity_path, key=key, value=request.value, value_json=value_json, confidence=confidence,
            memory_type=memory_type, agent_id=actor.agent_id, session_id=actor.session_id, written_at=now,
            ttl_at=ttl_at, importance_score=importance_score, importance_dimensions=importance_dimensions,
            tier=tier_for(score), priority_score=score, event_at=event_at,
            search_text=embedding_text(entity_path, key, request.value, event_at),
        )

    async def _with_embeddings(self, drafts: list[NewEntry]) -> list[NewEntry]:
        if self.embedder is None or not drafts:
            return drafts
        contexts = await self._contexts_of_drafts(drafts)
        made = await self._entry_vectors([(d.entity_path, d.key, d.value, d.event_at) for d in drafts], contexts)
        return [replace(draft, **fields) for draft, fields in zip(drafts, self._vector_fields(made, contexts))]

    # -- reads --------------------------------------------------------------------------------

    async def read(
        self,
        actor: Actor,
        entity_path: str,
        key: str,
        version: int | None = None,
        min_confidence: float | None = None,
    ) -> MemoryEntry:
        entity_path = v.validate_entity_path(entity_path)
        key = v.validate_key(key)
        version = v.validate_version(version)
        min_confidence = v.validate_min_confidence(min_confidence)
        now = self.now()
        current = await self.store.get_current(entity_path, key, now)
        if current is None:
            raise NotFoundError(
                f"No memory at '{entity_path}/{key}'. Call amfs_retrieve(query=...) or amfs_list(entity_path=...) to search."
            )
        entry = current
        if version is not None and version != current.version:
            found = await self.store.get_version(entity_path, key, version)
            if found is None or found.is_expired(now):
                raise NotFoundError(
                    f"'{entity_path}/{key}' has no version {version} (versions are numbered up to {current.version}; "
                    "forgotten or expired ones are gone). Call amfs_history to list them."
                )
            entry = found
        if min_confidence is not None and self.effective_confidence(entry, now) < min_confidence:
            raise NotFoundError(
                f"'{entity_path}/{key}' has effective confidence {self.effective_confidence(entry, now):.4f}, "
                f"below min_confidence={min_confidence}. Lower min_confidence to see it."
            )
        if actor.read_only:
            return self.with_current_tier(entry, now)
        entry = entry.with_changes(recall_count=entry.recall_count + 1)
        entry = self.with_current_tier(entry, now)
        await self._track(actor, "read", [entry], now)
        return entry

    async def peek(self, entity_path: str, key: str) -> MemoryEntry:
        """The current version with its current tier, for people inspecting the store: not an agent read, so
        no recall count, tier write or trace (nothing links it to an outcome)."""
        entity_path, key = v.validate_entity_path(entity_path), v.validate_key(key)
        now = self.now()
        current = await self.store.get_current(entity_path, key, now)
        if current is None:
            raise NotFoundError(f"No memory at '{entity_path}/{key}'. It may have been forgotten or expired.")
        return self.with_current_tier(current, now)

    async def peek_version(self, entity_path: str, key: str, version: int) -> MemoryEntry:
        """One version of a live entry, for people inspecting the store (like `peek`: not an agent read)."""
        current = await self.peek(entity_path, key)
        number = v.validate_version(version)
        if number is None:
            raise ValidationError("version is required, e.g. 1.")
        found = current if number == current.version else await self.store.get_version(current.entity_path, key, number)
        if found is None or found.is_expired(self.now()):
            raise NotFoundError(
                f"'{entity_path}/{key}' has no version {version} (versions are numbered up to {current.version}; "
                "expired ones are gone)."
            )
        return found

    async def _track(
        self,
        actor: Actor,
        kind: TraceKind,
        entries: list[MemoryEntry],
        now: datetime,
        details: list[dict[str, Any]] | None = None,
    ) -> None:
        """Bump recall counts, store refreshed tiers and trace the reads (they feed auto-causal linking and ML).

        Bookkeeping only: on a full disk the read still succeeds, without it (logged). A read-only actor's reads
        never get here (see `Actor`)."""
        try:
            await self._record_reads(actor, kind, entries, now, details)
        except StorageFullError as error:
            logger.warning("Read served without its bookkeeping (recall count, trace): %s", error)

    async def _record_reads(
        self,
        actor: Actor,
        kind: TraceKind,
        entries: list[MemoryEntry],
        now: datetime,
        details: list[dict[str, Any]] | None,
    ) -> None:
        await self.store.record_reads(
            actor,
            kind,
            [
                TierUpdate(e.entity_path, e.key, e.version, e.tier, e.priority_score or 0.0,
                           details[i] if details else None, e.provenance.written_at)
                for i, e in enumerate(entries)
            ],
            now,
        )

    async def history(self, entity_path: str, key: str, *, values: bool = True) -> list[MemoryEntry]:
        entity_path = v.validate_entity_path(entity_path)
        key = v.validate_key(key)
        versions = await self.entry_versions(entity_path, key, values=values)
        if not versions:
            raise NotFoundError(f"No memory at '{entity_path}/{key}'. Call amfs_list(entity_path=...) to see what exists.")
        now = self.now()
        return [self.with_current_tier(entry, now) for entry in versions]  # the tier as of now, as read shows it

    async def history_page(
        self, entity_path: str, key: str, limit: int, before_version: int | None = None
    ) -> tuple[AsyncIterator[MemoryEntry], int]:
        """The newest `limit` versions (of those numbered below `before_version`, when given), oldest first, each
        read whole as it is needed, so a caller that keeps a preview of each holds one value at a time; and how
        many older versions the page leaves out (0: it reaches the first)."""
        limit = v.validate_limit(limit, maximum=MAX_HISTORY_PAGE)
        before = v.validate_version(before_version)
        versions = [x for x in await self.history(entity_path, key, values=False) if before is None or x.version < before]
        page = versions[-limit:]
        return self._read_whole(page), len(versions) - len(page)

    async def history_one_by_one(self, entity_path: str, key: str) -> AsyncIterator[MemoryEntry]:
        """`history`, each version read whole as it is needed (see `history_page`)."""
        async for entry in self._read_whole(await self.history(entity_path, key, values=False)):
            yield entry

    async def _read_whole(self, versions: builtins.list[MemoryEntry]) -> AsyncIterator[MemoryEntry]:
        for version in versions:
            entry = await self.store.get_version(version.entity_path, version.key, version.version)
            if entry is not None and not entry.is_expired(now := self.now()):  # None: forgotten meanwhile
                yield self.with_current_tier(entry, now)

    async def search(
        self,
        entity_path: str | None = None,
        memory_type: MemoryType | str | None = None,
        min_confidence: float | None = None,
        agent_id: str | None = None,
        since: datetime | str | None = None,
        sort_by: SortBy = "confidence",
        limit: int = 20,
        event_after: datetime | str | None = None,
        event_before: datetime | str | None = None,
        value_head: int | None = None,
    ) -> list[MemoryEntry]:
        """Filter current entries (no query text); does not count as reading them. `event_after`/`event_before`
        keep entries whose event time (event_at, else the write time) lies in that range, ends included.
        `value_head=N`: a value whose JSON is longer than N characters comes as a `ValueHead` (for a preview)."""
        if sort_by not in SORT_CHOICES:
            raise ValidationError(f"sort_by must be one of {list(SORT_CHOICES)}, got {sort_by!r}.")
        limit = v.validate_limit(limit)
        min_confidence = v.validate_min_confidence(min_confidence)
        event_after, event_before = v.validate_event_range(event_after, event_before)
        since = v.validate_moment(since, "since")
        flt = EntryFilter(
            entity_path=v.validate_entity_prefix(entity_path),
            memory_type=None if memory_type is None else v.validate_memory_type(memory_type),
            agent_id=agent_id,
            since=since,
            min_stored_confidence=min_confidence if self.config.decay_half_life_days is None else None,
            event_after=event_after,
            event_before=event_before,
        )
        now = self.now()
        # With decay on, stored confidence over-states effective confidence, so filter after decay.
        needs_post_filter = min_confidence is not None and self.config.decay_half_life_days is not None
        sort_after = needs_post_filter or sort_by == "priority" or (
            sort_by == "confidence" and self.config.decay_half_life_days is not None
        )
        if not sort_after:
            entries = await self.store.find_current(flt, now, sort_by, limit, value_head=value_head)
            return [self.with_current_tier(entry, now) for entry in entries]
        # Every match is ranked here, so read them without values and then fetch the values of the `limit` kept.
        entries = [self.with_current_tier(entry, now)
                   for entry in await self.store.find_current(flt, now, sort_by, None, values=False)]
        if needs_post_filter:
            entries = [e for e in entries if self.effective_confidence(e, now) >= min_confidence]  # type: ignore[operator]
        if sort_by == "priority":
            entries.sort(key=lambda e: e.priority_score or 0.0, reverse=True)
        elif sort_by == "confidence":
            entries.sort(key=lambda e: self.effective_confidence(e, now), reverse=True)
        # The ranked versions' values: a key rewritten since the ranking read shows the version that was ranked.
        return await self._with_values(entries[:limit], value_head)

    async def list(
        self, entity_path: str | None = None, limit: int = 1000, *, value_head: int | None = None
    ) -> list[MemoryEntry]:
        """Current entries under an entity path, ordered by path and key (at most `limit` read); `value_head` as in
        `search`."""
        now = self.now()
        entries = await self.store.find_current(
            EntryFilter(entity_path=v.validate_entity_prefix(entity_path)), now, "path",
            v.validate_limit(limit, maximum=100_000), value_head=value_head,
        )
        return [self.with_current_tier(entry, now) for entry in entries]  # stored tiers date from the last write/read

    async def entity_counts(self, entity_path: str | None = None) -> dict[str, int]:
        """Current live entries per entity path (each path counts only the entries exactly at it)."""
        return await self.store.entity_counts(v.validate_entity_prefix(entity_path), self.now())

    async def entries_at(
        self, entity_path: str, offset: int = 0, limit: int = 50, *, value_head: int | None = None
    ) -> builtins.list[MemoryEntry]:
        """One page of the current entries at exactly `entity_path`, by key; does not count as reading them;
        `value_head` as in `search`."""
        entity_path = v.validate_entity_path(entity_path)
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ValidationError(f"offset must be an integer >= 0, got {offset!r}.")
        now = self.now()
        entries = await self.store.entries_at(entity_path, now, offset, v.validate_limit(limit), value_head=value_head)
        return [self.with_current_tier(entry, now) for entry in entries]

    # -- retrieval ----------------------------------------------------------------------------

    def learned_applies(self, entity_path: str | None = None) -> bool:
        """Whether the learned strategy takes part in a retrieval filtered to `entity_path` (None: unfiltered)."""
        if self.learned_scorer is None:
            return False
        return self._learned_covers is None or self._learned_covers(entity_path)

    def retrieval_weights(self, entity_path: str | None = None, query: str | None = None) -> dict[str, float]:
        """The configured weights as a retrieval filtered to `entity_path` (asking `query`) gets them."""
        return resolve_weights(
            self.config.retrieval_weights, learned_available=self.learned_applies(entity_path), fusion=self.config.fusion,
            query=query, embedder=self._embedder_name(),
        )

    def _embedder_name(self) -> str | None:
        return None if self.embedder is None else self.embedder.name

    async def retrieve(
        self,
        actor: Actor,
        query: str,
        entity_path: str | None = None,
        limit: int = 10,
        min_confidence: float | None = None,
        memory_type: MemoryType | str | None = None,
        depth: int = 3,
        explain: bool = False,
        weights: Mapping[str, float] | None = None,
        fusion: str | None = None,
        *,
        count_as_read: bool = True,
        event_after: datetime | str | None = None,
        event_before: datetime | str | None = None,
        whole_values: bool = True,
    ) -> builtins.list[RetrievedEntry]:
        """Hybrid search for `query` (see core/retrieval.py); returned entries count as read by the session.

        `depth` 1 searches hot entries, 2 adds warm, 3 adds archive. `weights` and `fusion` override the configured
        strategy weights and fusion for this call (benchmarks use them to measure single strategies and the seed's
        RRF). With `count_as_read=False` (a person looking, not an agent) recall counts, tiers and traces stay untouched.
        `event_after`/`event_before` keep only entries whose event time (event_at, else the write time) lies in range.
        With `whole_values=False` a value whose JSON is longer than `RANK_VALUE_HEAD` characters comes as a
        `ValueHead` (a preview, as listings show); the ranking is the same either way.
        """
        fusion = self.config.fusion if fusion is None else fusion
        count_as_read = count_as_read and not actor.read_only  # a read-only key leaves no trace (see Actor)
        if fusion not in FUSIONS:
            raise ValidationError(f"Unknown fusion {fusion!r}; use one of {list(FUSIONS)}.")
        if not isinstance(query, str) or not query.strip():
            raise ValidationError("query must be a non-empty string, e.g. 'how do we retry failed payments?'.")
        if len(query) > MAX_QUERY_CHARS:
            raise ValidationError(f"query is {len(query)} characters; the limit is {MAX_QUERY_CHARS}.")
        v.refuse_lone_surrogates(query, "query")
        if isinstance(depth, bool) or depth not in (1, 2, 3):
            raise ValidationError(f"depth must be 1 (hot), 2 (hot+warm) or 3 (all tiers), got {depth!r}.")
        limit = v.validate_limit(limit, maximum=100)
        min_confidence = v.validate_min_confidence(min_confidence)
        event_after, event_before = v.validate_event_range(event_after, event_before)
        flt = EntryFilter(
            entity_path=v.validate_entity_prefix(entity_path),
            memory_type=None if memory_type is None else v.validate_memory_type(memory_type),
            event_after=event_after,
            event_before=event_before,
        )
        learned = self.learned_applies(flt.entity_path)
        active = (
            resolve_weights(weights, learned_available=learned, fusion=fusion, query=query, embedder=self._embedder_name())
            if weights is not None or fusion != self.config.fusion else self.retrieval_weights(flt.entity_path, query)
        )
        now = self.now()
        # One pool for every limit up to candidate_pool / 2, so a larger limit extends the ranking of a smaller one
        # instead of reshuffling it; past that, twice the limit leaves room for the confidence and tier filters.
        pool_size = max(self.config.candidate_pool, limit * 2)
        # Confidence and tier depend on the time of asking, so the stores cannot apply them: each search is
        # widened until it has pool_size entries that pass (`_passing`), and the pool is made of those only.
        def passes(entry: MemoryEntry) -> bool:
            return ((min_confidence is None or self.effective_confidence(entry, now) >= min_confidence)
                    and int(self.with_current_tier(entry, now).tier) <= depth)

        keep = None if min_confidence is None and depth == len(Tier) else passes
        # Both searches always run: together they form the pool that every strategy ranks.
        semantic, keyword = await asyncio.gather(
            self._semantic_candidates(query, flt, now, pool_size, keep),
            self._keyword_candidates(query, flt, now, pool_size, keep),
        )
        if keyword and fusion == "rrf":
            cutoff = keyword[0][1] * self.config.keyword_min_relative_score
            keyword = [(entry, score) for entry, score in keyword if score >= cutoff]
        # The pool as read; a tier is worked out only where it is used (the learned ranker's features, the results).
        admitted: dict[str, MemoryEntry] = {}
        for entry, _ in [*semantic, *keyword]:
            admitted.setdefault(entry.entry_key, entry)
        # The speaker rule (off by default) is only worked out when it weighs something.
        speaker_query = query if active.get("speaker", 0.0) > 0 else None
        rankings = self._rankings(speaker_query, admitted, semantic, keyword, now, learned, flt.entity_path)
        if fusion == "hybrid":
            ranked = fuse_hybrid(rankings, active, self.config.candidate_pool)
        else:
            ranked = fuse(rankings, active, self.config.rrf_k)
        admitted.update(await self._whole(_same_heads(admitted.values())))  # long exact copies, if any
        fused = without_copies(ranked, admitted, limit)
        if whole_values:
            admitted.update(await self._whole([admitted[key] for key, _, _ in fused]))
            # A version forgotten since it was ranked (its value gone) is not returned as a head.
            fused = [item for item in fused if not isinstance(admitted[item[0]].value, ValueHead)]
        results = [RetrievedEntry(self.with_current_tier(admitted[key], now), score, rank, hits)
                   for rank, (key, score, hits) in enumerate(fused, 1)]
        if count_as_read:
            results = await self.record_retrieved(actor, query, results)
        if not explain:
            results = [replace(r, strategies=None) for r in results]
        copies = near_copies([r.entry.value for r in results])
        return [replace(r, near_copies=tuple(results[j].entry.entry_key for j in copies[i])) if copies[i] else r
                for i, r in enumerate(results)]

    async def record_retrieved(
        self, actor: Actor, query: str, hits: Sequence[RetrievedEntry]
    ) -> builtins.list[RetrievedEntry]:
        """Count `hits` (of `retrieve(query, ..., count_as_read=False, explain=True)`) as the session's reads, as
        `retrieve` does for what it returns: for a caller that uses only some of them (amfs_answer gives its model
        the memories that fit; the others were not read, so outcomes must not be linked to them). Returns the hits
        with their recall counts as now stored; a read-only actor leaves no trace."""
        if actor.read_only or not hits:
            return list(hits)
        counted = [replace(hit, entry=hit.entry.with_changes(recall_count=hit.entry.recall_count + 1)) for hit in hits]
        details = [{"query": query, "rank": hit.rank, "ranks": {name: s.rank for name, s in (hit.strategies or {}).items()}}
                   for hit in counted]
        await self._track(actor, "retrieve", [hit.entry for hit in counted], self.now(), details)
        return counted

    async def _passing(
        self,
        search: Callable[[int, bool], Awaitable[builtins.list[tuple[MemoryEntry, float]]]],
        pool_size: int,
        keep: Callable[[MemoryEntry], bool] | None,
    ) -> builtins.list[tuple[MemoryEntry, float]]:
        """The first `pool_size` of `search(n, values)`'s results that `keep` passes (all, without `keep`): the
        search is widened fourfold until that many pass, it finds no more, or it has looked through
        FILTERED_POOL_MAX. The widened searches read no values (12,800 rows of 4 KiB: +720 MiB for one call,
        red-team finding, 0.7.10); the kept ones get theirs afterwards (heads of long ones, as `search` reads
        values: `RANK_VALUE_HEAD`), and one forgotten meanwhile drops out."""
        if keep is None:
            return await search(pool_size, True)
        size = pool_size
        while True:
            found = await search(size, False)
            kept = [pair for pair in found if keep(pair[0])]
            if len(kept) >= pool_size or len(found) < size or size >= FILTERED_POOL_MAX:
                break
            size = min(size * 4, FILTERED_POOL_MAX)
        scores = {(e.entity_path, e.key, e.version): score for e, score in kept[:pool_size]}
        return [(e, scores[e.entity_path, e.key, e.version])
                for e in await self._with_values([entry for entry, _ in kept[:pool_size]], RANK_VALUE_HEAD)]

    async def _whole(self, entries: Sequence[MemoryEntry]) -> dict[str, MemoryEntry]:
        """Those of `entries` read by a head (`ValueHead`), with their whole values, by entry_key; one gone since
        is left out."""
        heads = [entry for entry in entries if isinstance(entry.value, ValueHead)]
        return {entry.entry_key: entry for entry in await self._with_values(heads)} if heads else {}

    async def _with_values(
        self, entries: builtins.list[MemoryEntry], value_head: int | None = None
    ) -> builtins.list[MemoryEntry]:
        """`entries` (read without values) with their versions' values, in order; a version gone since (forgotten,
        expired) drops out."""
        stored = await self.store.entry_values(entries, value_head=value_head)
        return [e.with_changes(value=stored[e.entity_path, e.key, e.version])
                for e in entries if (e.entity_path, e.key, e.version) in stored]

    async def _keyword_candidates(
        self, query: str, flt: EntryFilter, now: datetime, pool_size: int,
        keep: Callable[[MemoryEntry], bool] | None = None,
    ) -> builtins.list[tuple[MemoryEntry, float]]:
        terms = keyword_terms(query)
        if not terms:
            return []
        common = await self.store.common_terms(terms, self.config.keyword_max_term_matches, flt.entity_path)
        distinctive = [term for term in terms if term not in common]
        if not distinctive:
            return []
        return await self._passing(lambda size, values: self.store.keyword_candidates(
            distinctive, flt, now, size, values=values, value_head=RANK_VALUE_HEAD), pool_size, keep)

    async def _semantic_candidates(
        self, query: str, flt: EntryFilter, now: datetime, pool_size: int,
        keep: Callable[[MemoryEntry], bool] | None = None,
    ) -> builtins.list[tuple[MemoryEntry, float]]:
        if self.embedder is None:
            return []  # embedder explicitly configured off (AMFS_EMBEDDER=none): keyword and re-rankers only
        vector = (await asyncio.to_thread(embed_queries, self.embedder, [query]))[0]
        as_list = vector.tolist()
        nearest = await self._passing(lambda size, values: self.store.semantic_candidates(
            as_list, flt, now, size, values=values, value_head=RANK_VALUE_HEAD), pool_size, keep)
        # Second look at the nearest entries: each scored by its best sentence as well as its mean vector
        # (`entry_similarity`); the sort is stable, so equal scores keep the store's order.
        share = self.config.passage_share
        passages = await self.store.passage_vectors([entry for entry, _ in nearest]) if share > 0 else {}
        def score(entry: MemoryEntry, cosine: float) -> float:
            rows = passages.get(entry.entry_key)
            asked = None if rows is None else passage_questions(entry.value, len(rows))
            return entry_similarity(cosine, rows, vector, share, asked)

        scored = [(entry, score(entry, cosine)) for entry, cosine in nearest]
        return sorted(scored, key=lambda pair: -pair[1])

    def _rankings(
        self,
        speaker_query: str | None,
        admitted: dict[str, MemoryEntry],
        semantic: builtins.list[tuple[MemoryEntry, float]],
        keyword: builtins.list[tuple[MemoryEntry, float]],
        now: datetime,
        learned: bool,
        entity_path: str | None,
    ) -> builtins.list[RankedList]:
        relevant = {e.entry_key for e, _ in semantic[: self.config.rerank_pool]} | {
            e.entry_key for e, _ in keyword[: self.config.rerank_pool]
        }
        entries = [entry for key, entry in admitted.items() if key in relevant]
        rankings = [
            RankedList.from_scored("semantic", [(e.entry_key, s) for e, s in semantic if e.entry_key in admitted]),
            RankedList.from_scored("keyword", [(e.entry_key, s) for e, s in keyword if e.entry_key in admitted]),
            # A future event is not more recent than now (an event_at of 2200 took the whole temporal share).
            RankedList.from_scored("temporal", [(e.entry_key, recency_bucket(min(e.event_time, now))) for e in entries]),
            RankedList.from_scored("confidence", [(e.entry_key, self.effective_confidence(e, now)) for e in entries]),
        ]
        if speaker_query is not None:
            rankings.append(RankedList.from_scored("speaker", speaker_matches(speaker_query, entries)))
        if learned and self.learned_scorer is not None and entries:
            ranks = {ranking.strategy: dict(zip(ranking.keys, range(1, len(ranking.keys) + 1))) for ranking in rankings}
            per_entry = {e.entry_key: {name: ranks[name].get(e.entry_key, 0) for name in ranks} for e in entries}
            scores = self.learned_scorer([self.with_current_tier(e, now) for e in entries], per_entry, entity_path)
            rankings.append(RankedList.from_scored("learned", [(e.entry_key, s) for e, s in zip(entries, scores)]))
        return rankings

    # -- outcomes -----------------------------------------------------------------------------

    async def commit_outcome(
        self,
        actor: Actor,
        outcome_ref: str,
        outcome_type: OutcomeType | str,
        causal_entry_keys: builtins.list[str] | None = None,
    ) -> OutcomeRecord:
        """Apply an outcome to the named entries, or to everything this session read; once per outcome_ref."""
        outcome_ref = v.validate_outcome_ref(outcome_ref)
        resolved_type = v.validate_outcome_type(outcome_type)
        now = self.now()
        targets: list[OutcomeTarget] | None = None
        if causal_entry_keys is not None:
            if not causal_entry_keys:
                raise ValidationError(
                    "causal_entry_keys is empty; omit it to apply the outcome to every entry this session read."
                )
            targets = []
            for text in causal_entry_keys:
                try:
                    entity_path, key = split_entry_key(text)
                    target = OutcomeTarget(v.validate_entity_path(entity_path), v.validate_key(key), None)
                except ValidationError as error:
                    several = " (several entries are several list items, e.g. ['svc/a', 'svc/b'])" if "," in text else ""
                    raise ValidationError(f"causal_entry_keys item {text!r}{several}: {error}") from None
                if target not in targets:
                    targets.append(target)
        # One store call: existence (TTL honoured), the confidences and the new tiers share one transaction.
        record, _ = await self.store.apply_outcome(
            scoped_outcome_ref(actor.scope, outcome_ref), resolved_type, self.multipliers[resolved_type], actor, now,
            targets, lambda entry: self.with_current_tier(entry, now),
        )
        if actor.scope is None:
            return record
        # The caller sees its own ref; a record an unscoped key filed under this scope's namespace may name
        # entries elsewhere, and those stay out of the reply.
        effects = tuple(e for e in record.effects if under(e.entity_path, actor.scope))
        return replace(record, outcome_ref=outcome_ref, effects=effects)

    async def outcome_records(
        self, entity_path: str | None = None, *, key: str | None = None, newest_first: bool = False, offset: int = 0,
        limit: int | None = None,
    ) -> builtins.list[OutcomeRecord]:
        """See `MemoryStore.outcome_records`; a page (`limit`) is read as a page, not as the whole list."""
        path, key = self._outcome_filter(entity_path, key)
        return await self.store.outcome_records(path, key=key, newest_first=newest_first, offset=offset, limit=limit)

    async def count_outcomes(self, entity_path: str | None = None, *, key: str | None = None) -> int:
        path, key = self._outcome_filter(entity_path, key)
        return await self.store.count_outcomes(path, key=key)

    @staticmethod
    def _outcome_filter(entity_path: str | None, key: str | None) -> tuple[str | None, str | None]:
        if key is None:
            return v.validate_entity_prefix(entity_path), None
        if entity_path is None:
            raise ValidationError("Name the entry's entity_path along with its key.")
        return v.validate_entity_path(entity_path), v.validate_key(key)

    # -- maintenance --------------------------------------------------------------------------

    def after_erase(self, listener: Callable[[], Awaitable[Any]]) -> None:
        """Call `listener` after each forget (found or not), TTL expiry and clear, when the store is opened and at
        each expiry sweep: copies made from the store (the ML layer's export files) follow what was erased, also by
        other processes."""
        self._erase_listeners.append(listener)

    async def _erased(self) -> None:
        for listener in self._erase_listeners:
            try:
                await listener()
            except Exception as error:  # the store's erase has committed; say what still holds a copy
                logger.warning("After erasing memories, %s failed: %s", getattr(listener, "__qualname__", listener),
                               error)

    async def _to_the_end(self, erase: Awaitable[T]) -> T:
        """Run an erase and what follows it (`_erased`) to the end even if its caller is cancelled: a forget
        cancelled after its delete committed left the forgotten value in the training-data exports, whose scrub it
        stopped (red-team finding, 0.7.15; 6 of 6 SDK calls cancelled there). The caller still sees the
        cancellation; `close` waits for what is left."""
        task = asyncio.ensure_future(erase)
        self._erasing.add(task)
        task.add_done_callback(self._erasing.discard)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            task.add_done_callback(_report_unawaited_erase)  # no caller is left to hear how it ended
            raise

    async def forget(self, entity_path: str, key: str) -> int:
        entity_path, key = v.validate_entity_path(entity_path), v.validate_key(key)
        return await self._to_the_end(self._forget(entity_path, key))

    async def _forget(self, entity_path: str, key: str) -> int:
        try:
            removed = await self.store.forget(entity_path, key)
        finally:
            # Also when nothing was found or the store failed: a retry after a reply lost with the connection
            # finds nothing, yet the first attempt's delete may have committed.
            await self._erased()
        if removed == 0:
            raise NotFoundError(f"No memory at '{entity_path}/{key}'; nothing was forgotten.")
        return removed

    async def purge_expired(self) -> int:
        return await self._to_the_end(self._purge_expired())

    async def _purge_expired(self) -> int:
        removed = await self.store.purge_expired(self.now())
        if removed:
            await self._erased()
        return removed

    async def clear(self) -> None:
        """Delete every memory, outcome and trace. The record of the embedder stays (or becomes this service's):
        servers still running with it keep writing its vectors, and a server configured for another embedder must
        keep being refused (after a clear it used to open the store and mix the two)."""
        await self._to_the_end(self._clear())

    async def _clear(self) -> None:
        if self.embedder is not None:
            await self.store.clear()
            await self._record_embedder()
        else:
            kept = {name: await self.store.get_meta(name) for name in (EMBEDDER_META, ENTRY_VECTORS_META)}
            await self.store.clear()
            for name, value in kept.items():
                if value is not None:
                    await self.store.set_meta(name, value)
        await self._erased()

    async def export_snapshot(self) -> StoreSnapshot:
        await self.purge_expired()  # an export never carries a memory whose TTL passed
        return await self.store.export_snapshot()

    async def import_snapshot(self, snapshot: StoreSnapshot, *, pending: str | None = None) -> None:
        """Import a snapshot (`memory import`): refused, writing nothing, when a key or outcome ref exists, when
        its meta is invalid, or when its vectors come from another embedder than the store's. Meta the store
        holds is kept (an import adds, it never overwrites), but for the embedder's record of an empty store.
        Without an embedder (the command), a store holding no entry version takes the file's vector width (a
        PostgreSQL store's column changes with the import); with one, vectors of another width are refused.
        `pending`: a token for what the caller imports next, elsewhere; marked in this import's own transaction
        (`IMPORT_PENDING_META`) until `import_finished(pending)`, so a rerun after a kill in between asks
        `import_pending()` instead of finding the memories it would write again already there."""
        self._check_importable_records(snapshot)
        meta = await self._importable_meta(snapshot)
        meta.pop(IMPORT_PENDING_META, None)  # a file's own mark (not exported; hand-made) is never taken
        if pending is not None:
            meta[IMPORT_PENDING_META] = pending
        await self.store.import_snapshot(replace(snapshot, meta=meta))
        await self.refresh_calibrated_multipliers()

    async def import_pending(self) -> str | None:
        """The token of an import whose memories are in and whose caller had more to import (see import_snapshot)."""
        value = await self.store.get_meta(IMPORT_PENDING_META)
        return value if isinstance(value, str) else None

    async def import_finished(self, pending: str) -> None:
        """Clear the mark of the import `pending`, unless another import has marked the store since."""
        await self.store.update_meta([IMPORT_PENDING_META], lambda held: (
            {IMPORT_PENDING_META: None} if held[IMPORT_PENDING_META] == pending else {}))

    def _check_importable_records(self, snapshot: StoreSnapshot) -> None:
        """What the live paths refuse, an import refuses too: an outcome ref `amfs_commit_outcome` would refuse or
        change (padded, invisible characters, not NFC: two records for one incident), and vectors of more than one
        dimension (a store holds one)."""
        for record in snapshot.outcomes:
            ref = unscoped_outcome_ref(record.outcome_ref)
            try:
                valid = v.validate_outcome_ref(ref) == ref
            except ValidationError:
                valid = False
            if not valid:
                raise ValidationError(
                    f"outcome {record.outcome_ref!r}: not a ref amfs_commit_outcome accepts as it is (padding, control "
                    "or invisible characters, or not in Unicode NFC). Nothing was imported."
                )
        dimensions = vector_widths(snapshot)
        if len(dimensions) > 1 or (self.embedder is not None and dimensions and dimensions != [self.embedder.dimension]):
            raise ValidationError(
                f"The file's vectors have {dimensions} dimensions"
                + (f"; this store's embedder makes {self.embedder.dimension}" if self.embedder is not None else "")
                + ". Nothing was imported."
            )

    async def _importable_meta(self, snapshot: StoreSnapshot) -> dict[str, Any]:
        meta = snapshot.meta
        if meta.get(MULTIPLIERS_META) is not None:
            try:
                validate_multipliers(meta[MULTIPLIERS_META])
            except ValidationError as error:
                raise ValidationError(f"meta.{MULTIPLIERS_META}: {error} Nothing was imported.") from None
        for name in (EMBEDDER_META, ENTRY_VECTORS_META):
            if name in meta and not isinstance(meta[name], str):
                raise ValidationError(f"meta.{name} must be a string, got {meta[name]!r}. Nothing was imported.")
        empty = not await self.store.find_current(EntryFilter(), self.now(), "recency", 1, values=False)
        carries_vectors = any(entry.embedding is not None for entry in snapshot.entries)
        kept: dict[str, Any] = {}
        for name, value in meta.items():
            held = await self.store.get_meta(name)
            vectors_record = name in (EMBEDDER_META, ENTRY_VECTORS_META)
            if held is None or (empty and vectors_record):
                kept[name] = value
            elif vectors_record and carries_vectors and held != value:
                raise ValidationError(
                    f"The file's vectors were made as {name}={value!r}, this store's as {held!r}; the two do not "
                    "mix, so nothing was imported. Import into an empty store (then `amfs-server memory reembed` "
                    "if needed), or re-embed one of them first."
                )
        return kept


def _report_unawaited_erase(task: asyncio.Future[Any]) -> None:
    if task.cancelled() or task.exception() is None:
        return
    error = task.exception()
    level = logging.DEBUG if isinstance(error, NotFoundError) else logging.WARNING
    logger.log(level, "An erase whose caller was cancelled ended in an error: %s", error)


COPY_MIN_CHARS = 64
"""The shortest string value `without_copies` collapses."""


def _same_heads(entries: Iterable[MemoryEntry]) -> builtins.list[MemoryEntry]:
    """The entries read by a head whose string value has the same head and length as another's: only their whole
    values tell whether they are copies (`without_copies` compares whole strings)."""
    heads = [e for e in entries if isinstance(e.value, ValueHead) and e.value.json_head.startswith('"')]
    count = Counter((e.value.json_head, e.value.json_chars) for e in heads)
    return [e for e in heads if count[e.value.json_head, e.value.json_chars] > 1]


def without_copies(
    ranked: builtins.list[tuple[str, float, Any]], entries: Mapping[str, MemoryEntry], limit: int
) -> builtins.list[tuple[str, float, Any]]:
    """The first `limit` of `ranked`, where several entries hold the same string value, one of them in the place of
    the first ranked: ten results are not ten copies. A red-team pass wrote 29 copies of one memory and cut a
    conversation's recall@10 from 0.845 to 0.792, the copies taking several places of one top ten (0.7.11). The one
    kept is the earliest written, the original: a copy written later (recency's tie-breaker favours it) does not
    stand in for it. Only copies that read the same (`visible_text`: invisible characters and spacing aside) of at
    least COPY_MIN_CHARS characters go: a short value ("enabled",
    "Caroline: Thanks!") means something different under each key, and its key is part of what was ranked."""
    seen: dict[str, str | None] = {}

    def copy_key(item: tuple[str, float, Any]) -> str | None:
        if item[0] not in seen:
            value = entries[item[0]].value
            text = visible_text(value) if isinstance(value, str) else ""
            seen[item[0]] = text if len(text) >= COPY_MIN_CHARS else None
        return seen[item[0]]

    copies: dict[str, builtins.list[tuple[str, float, Any]]] = {}
    for item in ranked:
        if (value := copy_key(item)) is not None:
            copies.setdefault(value, []).append(item)
    kept: builtins.list[tuple[str, float, Any]] = []
    for item in ranked:
        if (value := copy_key(item)) is not None:
            group = copies[value]
            if group[0] is not item:
                continue  # a later-ranked copy: its group is in the first one's place
            # In the first copy's place with its own score and explanation (so a score may sit just below the next).
            item = min(group, key=lambda copy: entries[copy[0]].provenance.written_at)
        kept.append(item)
        if len(kept) == limit:
            break
    return kept
