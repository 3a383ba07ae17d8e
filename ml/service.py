"""MLService: the one object the ML front ends (MCP tools, CLI) call; each method is one ML operation.

The composition root builds it next to the MemoryService and awaits `start()` once the service is
open: it loads the ranker models persisted in the store, installs them into retrieval, and starts the
watcher that picks up models and multipliers another process trained or applied (`ml.shared`);
`stop()` ends the watcher. Exports asked for by file name land under `export_dir` (by default
`<data dir>/ml/exports`, see `Settings.ml_dir`): a caller over MCP names a file, never a path
elsewhere on the server.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from pathlib import Path, PurePath

from ..core.errors import ValidationError
from ..core.validation import has_hidden_characters
from ..core.service import MemoryService
from ._common import Progress
from .calibrator import CalibrationReport, ConfidenceCalibrator
from .export import ExportFormat, ExportResult, TrainingDataExporter, scrub_exports
from .ranker import LearnedRanker, RankerMetrics
from .shared import MULTIPLIERS, POLL_SECONDS, RANKER, SharedStateWatcher

DEFAULT_EXPORT_LIMIT = 100


class MLService:
    def __init__(
        self, service: MemoryService, export_dir: Path | str, *, poll_seconds: float = POLL_SECONDS,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self.service = service
        self.export_dir = Path(export_dir)
        self.ranker = LearnedRanker(service, clock=clock or service.now)  # one clock: the memory service's unless given
        self.calibrator = ConfidenceCalibrator(service)
        self.exporter = TrainingDataExporter(service)
        self.watcher = SharedStateWatcher(
            service, {RANKER: self._reload_ranker, MULTIPLIERS: service.refresh_calibrated_multipliers}, poll_seconds
        )

    async def start(self, watch: bool = True) -> list[RankerMetrics]:
        """Serve the persisted ranker models (the learned strategy stays off without one) and watch for newer ones."""
        await self.watcher.mark_current()
        loaded = await self._reload_ranker()
        if watch:
            self.watcher.start()
        return loaded

    async def stop(self) -> None:
        await self.watcher.stop()

    async def _reload_ranker(self) -> list[RankerMetrics]:
        loaded = await self.ranker.load()
        self.ranker.install()
        return loaded

    async def retrain(self, entity_path: str | None = None, progress: Progress | None = None) -> RankerMetrics:
        return await self.ranker.train(entity_path, progress=progress)

    async def calibrate(
        self, per_entity: bool = False, apply: bool = False, progress: Progress | None = None
    ) -> CalibrationReport:
        return await self.calibrator.calibrate(per_entity=per_entity, apply=apply, progress=progress)

    async def revert_calibration(self) -> dict[str, float]:
        return await self.calibrator.revert()

    async def export_training_data(
        self,
        format: ExportFormat | str,
        entity_path: str | None = None,
        limit: int | None = DEFAULT_EXPORT_LIMIT,
        output_path: str | None = None,
        progress: Progress | None = None,
        namespace: str | None = None,
    ) -> ExportResult:
        """The examples themselves, or, with `output_path`, JSONL streamed to that file under export_dir.

        `namespace` (the caller's identity when an API key says who it is) gives each caller its own folder,
        `export_dir/<namespace>/`, so one key cannot overwrite another's exports."""
        if output_path is None:
            return await self.exporter.export(format, entity_path, limit)
        written = await self.exporter.write_jsonl(
            self.output_file(output_path, namespace), format, entity_path, limit, progress, root=self.export_dir
        )
        # It read the store before it wrote: a forget that committed meanwhile may have scrubbed before it was there.
        await scrub_exports(self.service, self.export_dir)
        return written

    def output_file(self, output_path: str, namespace: str | None = None) -> PurePath:
        """`output_path` as a path relative to export_dir (under `namespace`); absolute paths and `..` are refused."""
        relative = PurePath(output_path)
        # Control characters: NUL cannot be in a file name at all, and a newline makes a name that breaks listings.
        if not output_path.strip() or relative.is_absolute() or ".." in relative.parts or relative.name in ("", ".") \
                or has_hidden_characters(output_path):
            raise ValidationError(
                f"output_path {output_path!r} must be a relative file name such as 'sft/train.jsonl'; exports are "
                f"written under {self.export_dir}."
            )
        return PurePath(namespace, relative) if namespace is not None else relative
