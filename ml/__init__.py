"""The ML layer: learned retrieval ranking, outcome calibration and training-data export.

Everything here learns from what the store already persists (decision traces and outcome records,
see `ml.traces`) and reads and writes it through MemoryService's public methods (never the store itself);
nothing here imports a front end.
"""

from __future__ import annotations

from .calibrator import CalibrationReport, ConfidenceCalibrator, MultiplierSet, TypeSignal
from .export import ExportFormat, ExportResult, TrainingDataExporter
from .features import FEATURE_NAMES
from .ranker import LearnedRanker, RankerMetrics, load_installed_models
from .service import MLService
from .traces import DecisionTrace, OutcomeHistory

__all__ = [
    "FEATURE_NAMES",
    "CalibrationReport",
    "ConfidenceCalibrator",
    "DecisionTrace",
    "ExportFormat",
    "ExportResult",
    "LearnedRanker",
    "MLService",
    "MultiplierSet",
    "OutcomeHistory",
    "RankerMetrics",
    "TrainingDataExporter",
    "TypeSignal",
    "load_installed_models",
]
