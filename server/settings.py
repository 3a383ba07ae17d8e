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


class Settings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    data_dir: Path = Field(default_factory=lambda: Path.home() / ".amfs")
    postgres_dsn: str | None = None
    agent_id: str | None = None
    decay_half_life_days: float | None = None
    max_value_bytes: int = 1024 * 1024
    embedder: str | None = DEFAULT_EMBEDDER
    ml_model_dir: Path = Path(".amfs/ml")
    api_keys: str | None = None
    allowed_origins: str | None = None
    lm_backbone: str | None = None
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
