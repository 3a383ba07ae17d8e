"""Server logging: everything to stderr (on stdio, stdout carries the protocol and nothing else), repeats collapsed."""

from __future__ import annotations

import copy
import logging
import sys
from typing import Any

from ..core.errors import ValidationError
from .limits import RepeatFilter
from .settings import LOG_LEVELS


def configure_logging(level: int | str = logging.INFO) -> None:
    """Server logs go to stderr: on stdio, stdout carries the protocol and nothing else.

    `level` is a logging level or one of LOG_LEVELS (any case); anything else is a ValidationError."""
    level = log_level_number(level)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(RepeatFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.getLogger("fastmcp").setLevel(level)  # FastMCP logs through its own handler, not the root's


def log_level_number(level: int | str) -> int:
    if isinstance(level, int):
        return level
    if level.strip().lower() not in LOG_LEVELS:
        raise ValidationError(f"Log level {level!r} is not one of {', '.join(LOG_LEVELS)} (--log-level, AMFS_LOG_LEVEL).")
    return logging.getLevelNamesMapping()[level.strip().upper()]


def uvicorn_log_config() -> dict[str, Any]:
    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    config["filters"] = {"repeats": {"()": RepeatFilter}}
    for handler in config["handlers"].values():
        handler["stream"] = "ext://sys.stderr"
        handler["filters"] = ["repeats"]
    return config
