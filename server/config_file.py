"""The YAML config file's face to the user: `amfs-server config show` (`settings_in_force`), and the names
the learning section has always been reached by. The file's layout, its precedence and the one map of
environment variables are in `server.settings`; the learning service is built in `server.composition`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .composition import LEARNING_DB, build_learning_service, learning_storage
from .settings import (
    DEFAULT_CONFIG_PATH,
    ENV_VARS,
    ConfidenceSettings,
    IntelligenceSettings,
    LearningSettings,
    PatternSettings,
    PrivacySettings,
    Settings,
    StorageSettings,
    config_path,
    load_learning_settings,
    read_config_file,
)

__all__ = [
    "DEFAULT_CONFIG_PATH", "ENV_OVERRIDES", "LEARNING_DB", "ConfidenceSettings", "IntelligenceSettings",
    "LearningSettings", "PatternSettings", "PrivacySettings", "StorageSettings", "build_learning_service",
    "config_path", "learning_storage", "load_learning_settings", "read_config_file", "settings_in_force",
]

ENV_OVERRIDES: dict[str, tuple[str, ...]] = {
    name: path[1:] for name, path in ENV_VARS.items() if path[0] == "learning"
}
"""The learning section's environment variables (`ENV_VARS` less the section's name), as documented in the README."""


def settings_in_force(settings: Settings, source: Path | None) -> dict[str, Any]:
    """The settings in force, secrets hidden, as plain data for `amfs-server config show`."""
    from ..adapters.postgres_base import redact_dsn

    server = settings.model_dump(mode="json", exclude={"learning"})
    if settings.postgres_dsn:
        server["postgres_dsn"] = redact_dsn(settings.postgres_dsn) + " (password hidden)"
    if settings.api_keys:
        server["api_keys"] = "(set, hidden)"
    learning = settings.learning.model_dump(mode="json")
    kind, where = learning_storage(settings)
    learning["storage"] = {**learning["storage"], "type": kind, "path" if kind == "sqlite" else "dsn": where}
    learning["storage"].pop("retention_days", None)
    if kind == "postgresql":
        learning["storage"].pop("path", None)
    return {"config_file": str(source) if source else None, "server": server, "learning": learning}
