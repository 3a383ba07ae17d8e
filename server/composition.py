"""The composition root: `Settings` -> every service a front end uses. The MCP server, the memory
browser, the CLI and the SDK all build theirs with `build_services` (`build_service` is its shorthand for
the memory service alone), so each is wired one way, with one clock."""

from __future__ import annotations

import asyncio
import importlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..adapters import create_store
from ..core.confidence import DEFAULT_MULTIPLIERS
from ..core.errors import ValidationError
from ..core.learning import LearningService
from ..core.models import utcnow
from ..core.service import MemoryService, ServiceConfig
from .settings import IntelligenceSettings, Settings

if TYPE_CHECKING:
    from ..ml.answer.worker import LMWorker
    from ..ml.service import MLService

LEARNING_DB = "learning.db"
Clock = Callable[[], datetime]


@dataclass
class Services:
    """What one front end runs on. `open` and `close` start and stop them in dependency order."""

    settings: Settings
    memory: MemoryService
    learning: LearningService | None = None
    ml: MLService | None = None
    worker: LMWorker | None = None

    async def open(self, *, check_embedder: bool = True, watch: bool = True) -> None:
        """`watch`: a long-running front end (follow retraining, erase expired memories as they expire); a
        one-shot command passes False."""
        await self.memory.open(check_embedder=check_embedder)
        try:
            if watch:
                self.memory.start_expiry_sweeps()
            if self.ml is not None:
                await self.ml.start(watch=watch)  # stored ranker models join retrieval; a watcher follows retraining
            if self.learning is not None:
                await self.learning.open()
        except BaseException:
            await self.close()  # each close is a no-op for what did not open
            raise

    async def close(self) -> None:
        if self.learning is not None:
            await self.learning.close()
        if self.worker is not None:
            await asyncio.to_thread(self.worker.close)  # waits for an answer in progress
        if self.ml is not None:
            await self.ml.stop()
        await self.memory.close()


def build_services(
    settings: Settings,
    *,
    learning: bool | None = None,
    ml: bool = False,
    worker: bool | None = None,
    clock: Clock | None = None,
    memory: MemoryService | None = None,
) -> Services:
    """Every service `settings` call for, none opened yet.

    learning: build the learning service (None: when `settings.learning.enabled`; True: whatever it says, for
    the commands that show, export or clear stored learning data). ml: the ML service (ranker, calibrator).
    worker: the local LM worker behind amfs_answer (None: when `settings.lm_backbone` names one). clock:
    what "now" is for every service (None: the wall clock). memory: a memory service built already."""
    memory = memory or _memory_service(settings, clock)
    now = clock or memory.now  # one clock: the memory service's, unless one is given
    learning_service = None
    if learning or (learning is None and settings.learning.enabled):
        learning_service = build_learning_service(settings, now)
    ml_service = None
    if ml:
        from ..ml.service import MLService

        ml_service = MLService(memory, settings.ml_dir / "exports", clock=now)
    lm_worker = None
    if worker or (worker is None and settings.lm_backbone):
        from ..ml.answer.worker import LMWorker

        if not settings.lm_backbone:
            raise ValidationError("The answer worker needs a model: set AMFS_LM_BACKBONE or --lm-backbone.")
        lm_worker = LMWorker(settings.lm_backbone)  # loads lazily, on the first answer
    return Services(settings, memory, learning_service, ml_service, lm_worker)


def build_service(settings: Settings) -> MemoryService:
    """The memory service alone (the SDK, the inspection commands, benchmarks)."""
    return build_services(settings, learning=False).memory


def _memory_service(settings: Settings, clock: Clock | None) -> MemoryService:
    embedder = None
    if settings.embedder is not None:
        from ..adapters.embedders import load_embedder

        embedder = load_embedder(settings.embedder, settings.embed_threads, settings.query_encoder)
    store = create_store(
        settings.sqlite_path, settings.postgres_dsn, embedding_dimension=embedder.dimension if embedder else None
    )
    config = ServiceConfig(
        decay_half_life_days=settings.decay_half_life_days,
        max_value_bytes=settings.max_value_bytes,
        multipliers=dict(DEFAULT_MULTIPLIERS),
        fusion=settings.fusion,
    )
    memory = MemoryService(store, config, embedder=embedder, clock=clock)
    from ..ml.export import follow_erasures  # no heavy import: the exporter's file handling only

    follow_erasures(memory, settings.ml_dir / "exports")  # every front end: what it erases leaves the exports too
    return memory


def learning_storage(settings: Settings) -> tuple[str, str]:
    """('sqlite', path) or ('postgresql', where) for the learning store these settings select."""
    learning = settings.learning
    kind = learning.storage.type
    if kind == "auto":
        kind = "postgresql" if settings.postgres_dsn else "sqlite"
    if kind == "postgresql":
        if not settings.postgres_dsn:
            raise ValidationError(
                "learning.storage.type is postgresql but AMFS_POSTGRES_DSN is not set; set it, or use type: sqlite."
            )
        from ..adapters.postgres_base import redact_dsn

        return "postgresql", redact_dsn(settings.postgres_dsn)
    path = learning.storage.path.expanduser() if learning.storage.path else settings.data_dir / LEARNING_DB
    return "sqlite", str(path)


def build_learning_service(settings: Settings, clock: Clock | None = None) -> LearningService:
    """The learning service over the store the settings select (not opened: it opens on first use)."""
    kind, where = learning_storage(settings)
    if kind == "postgresql":
        from ..adapters.postgres_learning import PostgresLearningStore

        store: Any = PostgresLearningStore(settings.postgres_dsn)  # type: ignore[arg-type]
    else:
        from ..adapters.sqlite_learning import SQLiteLearningStore

        store = SQLiteLearningStore(where)
    return LearningService(
        store, settings.learning.to_config(), analyzer=_analyzer(settings.learning.intelligence), clock=clock or utcnow
    )


def _analyzer(intelligence: IntelligenceSettings) -> Any:
    if intelligence.analyzer is None:
        return None
    module_name, _, attribute = intelligence.analyzer.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError, ValueError) as error:
        raise ValidationError(
            f"learning.intelligence.analyzer {intelligence.analyzer!r} cannot be loaded ({error}); it must name "
            "'package.module:factory'. Remove it to run without LLM analysis."
        ) from None
    return factory()


def preload_embedder(settings: Settings) -> None:
    """Start loading the configured embedding model in a background thread, before the caller imports the MCP
    stack: the two overlap (onnxruntime builds its session without the GIL), so the first write waits less.
    The same cached instance serves the service; a failure is left to the server's warm-up and first write,
    which report it."""
    if settings.embedder is None:
        return

    def load() -> None:
        try:
            from ..adapters.embedders import load_embedder

            load_embedder(settings.embedder, settings.embed_threads, settings.query_encoder).load()
        except Exception:
            logging.getLogger(__name__).debug("Preloading the embedder failed", exc_info=True)

    threading.Thread(target=load, name="amfs-embedder-preload", daemon=True).start()
