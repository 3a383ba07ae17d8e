"""Settings: `AMFS_*` environment variables over an optional YAML config file, read once at a composition root."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..core.embedding import DEFAULT_EMBEDDER
from ..core.errors import ValidationError
from .config_file import LearningSettings
from .limits import ServerLimits

LOG_LEVELS = ("debug", "info", "warning", "error")
"""The values of `amfs-server --log-level` / AMFS_LOG_LEVEL."""


class Settings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    data_dir: Path = Field(default_factory=lambda: Path.home() / ".amfs")
    postgres_dsn: str | None = None
    agent_id: str | None = None
    decay_half_life_days: float | None = None
    max_value_bytes: int = 1024 * 1024
    embedder: str | None = DEFAULT_EMBEDDER
    ml_model_dir: Path | None = None
    """Where ML exports go (models themselves live in the store); None: `<data_dir>/ml`, see `ml_dir`."""
    api_keys: str | None = None
    allowed_origins: str | None = None
    lm_backbone: str | None = None
    sessions_per_key: int = Field(32, ge=1)
    calls_per_key: int = Field(4, ge=1)
    max_response_bytes: int = Field(16 * 1024 * 1024, ge=1024)
    header_timeout_s: float = Field(10.0, gt=0)
    learning: LearningSettings = Field(default_factory=LearningSettings)
    """The config file's `learning:` section with its overrides (server.config_file.load_learning_settings)."""

    @field_validator("postgres_dsn")
    @classmethod
    def _dsn_scheme(cls, dsn: str | None) -> str | None:
        if dsn and not dsn.startswith(("postgresql://", "postgres://")):
            raise ValueError("AMFS_POSTGRES_DSN must be a postgresql:// URL, e.g. postgresql://user@host:5432/amfs")
        return dsn or None

    @field_validator("embedder")
    @classmethod
    def _embedder_none(cls, name: str | None) -> str | None:
        return None if name is None or name.strip().lower() in {"", "none", "off"} else name

    @property
    def sqlite_path(self) -> Path:
        return self.data_dir / "amfs.db"

    @property
    def ml_dir(self) -> Path:
        """Under the data directory unless set: never the working directory (Claude Desktop starts servers in /)."""
        return self.ml_model_dir if self.ml_model_dir is not None else self.data_dir / "ml"

    @property
    def limits(self) -> ServerLimits:
        return ServerLimits(
            sessions_per_key=self.sessions_per_key, calls_per_key=self.calls_per_key,
            max_response_bytes=self.max_response_bytes, header_timeout_s=self.header_timeout_s,
        )


_ENV_FIELDS = {
    "AMFS_DATA_DIR": "data_dir",
    "AMFS_POSTGRES_DSN": "postgres_dsn",
    "AMFS_AGENT_ID": "agent_id",
    "AMFS_DECAY_HALF_LIFE_DAYS": "decay_half_life_days",
    "AMFS_MAX_VALUE_BYTES": "max_value_bytes",
    "AMFS_EMBEDDER": "embedder",
    "AMFS_ML_MODEL_DIR": "ml_model_dir",
    "AMFS_API_KEYS": "api_keys",
    "AMFS_ALLOWED_ORIGINS": "allowed_origins",
    "AMFS_LM_BACKBONE": "lm_backbone",
    "AMFS_SESSIONS_PER_KEY": "sessions_per_key",
    "AMFS_CALLS_PER_KEY": "calls_per_key",
    "AMFS_MAX_RESPONSE_BYTES": "max_response_bytes",
    "AMFS_HEADER_TIMEOUT_S": "header_timeout_s",
}


def load_settings(environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
    """Environment first, then explicit overrides (CLI flags, SDK arguments) that are not None."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {field: environ[name] for name, field in _ENV_FIELDS.items() if environ.get(name)}
    values.update({name: value for name, value in overrides.items() if value is not None})
    try:
        return Settings(**values)
    except Exception as error:  # pydantic's message names the field and the problem
        raise ValidationError(f"Invalid amfs-server settings: {error}") from None
