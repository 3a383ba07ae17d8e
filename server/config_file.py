"""The YAML config file's `learning:` section, its environment overrides, and the learning service built
from it. Read once, at a composition root (`amfs-server serve`, the `memory` and `config` commands).

Precedence, lowest first: defaults, the config file (`AMFS_CONFIG`, else `~/.amfs/config.yaml` when it
exists), `AMFS_*` environment variables, command-line flags. `${VAR}` in a string value is replaced by
that environment variable. Unknown keys under `learning:` are refused (a typo must not silently turn
a privacy switch off); other top-level sections belong to other settings and are left alone.

```yaml
learning:
  enabled: true                  # AMFS_LEARNING_ENABLED          (serve --no-learning)
  preference_learning: true      # AMFS_PREFERENCE_LEARNING       (serve --no-preference-learning)
  pattern_detection: true        # AMFS_PATTERN_DETECTION         (serve --no-pattern-detection)
  retention_days: 90             # AMFS_RETENTION_DAYS (storage.retention_days is accepted too)
  storage:
    type: auto                   # AMFS_LEARNING_STORAGE: auto | sqlite | postgresql
    path: ~/.amfs/learning.db    # AMFS_LEARNING_PATH (sqlite; default <data_dir>/learning.db)
  confidence:
    suggest: 0.3                 # AMFS_CONFIDENCE_SUGGEST
    confirm: 0.6                 # AMFS_CONFIDENCE_CONFIRM
    auto_apply: 0.8              # AMFS_CONFIDENCE_AUTO_APPLY
  privacy:
    anonymize: false             # AMFS_ANONYMIZE
  patterns:
    min_support: 3               # AMFS_PATTERN_MIN_SUPPORT
    timezone: UTC                # AMFS_PATTERN_TIMEZONE (for time-of-day patterns)
  intelligence:
    provider: none               # the optional LLM hook: off; see `analyzer`
```
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..core.errors import ValidationError
from ..core.learning import LearningConfig, LearningService, Thresholds
from ..core.patterns import PatternOptions

if TYPE_CHECKING:
    from .settings import Settings

DEFAULT_CONFIG_PATH = Path("~/.amfs/config.yaml")
LEARNING_DB = "learning.db"

ENV_OVERRIDES: dict[str, tuple[str, ...]] = {
    "AMFS_LEARNING_ENABLED": ("enabled",),
    "AMFS_PREFERENCE_LEARNING": ("preference_learning",),
    "AMFS_PATTERN_DETECTION": ("pattern_detection",),
    "AMFS_RETENTION_DAYS": ("retention_days",),
    "AMFS_LEARNING_STORAGE": ("storage", "type"),
    "AMFS_LEARNING_PATH": ("storage", "path"),
    "AMFS_CONFIDENCE_SUGGEST": ("confidence", "suggest"),
    "AMFS_CONFIDENCE_CONFIRM": ("confidence", "confirm"),
    "AMFS_CONFIDENCE_AUTO_APPLY": ("confidence", "auto_apply"),
    "AMFS_ANONYMIZE": ("privacy", "anonymize"),
    "AMFS_PATTERN_MIN_SUPPORT": ("patterns", "min_support"),
    "AMFS_PATTERN_TIMEZONE": ("patterns", "timezone"),
}
_ENV_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StorageSettings(_Section):
    type: Literal["auto", "sqlite", "postgresql"] = "auto"
    """auto: PostgreSQL when the server uses it (AMFS_POSTGRES_DSN), else SQLite."""
    path: Path | None = None
    retention_days: float | None = Field(None, gt=0, description="The document's spelling of learning.retention_days.")

    @field_validator("type", mode="before")
    @classmethod
    def _postgres_alias(cls, value: Any) -> Any:
        return "postgresql" if isinstance(value, str) and value.lower() in {"postgres", "postgresql", "pg"} else value


class ConfidenceSettings(_Section):
    suggest: float = Field(0.3, ge=0, le=1)
    confirm: float = Field(0.6, ge=0, le=1)
    auto_apply: float = Field(0.8, ge=0, le=1)

    @model_validator(mode="after")
    def _ordered(self) -> ConfidenceSettings:
        if not self.suggest <= self.confirm <= self.auto_apply:
            raise ValueError(
                f"thresholds must satisfy suggest <= confirm <= auto_apply (got {self.suggest}, {self.confirm}, "
                f"{self.auto_apply})"
            )
        return self


class PrivacySettings(_Section):
    anonymize: bool = False
    cloud_sync: Literal[False] = False
    """Accepted for the document's layout; amfs never syncs learning data anywhere."""


class PatternSettings(_Section):
    min_support: int = Field(3, ge=2)
    timezone: str = "UTC"

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, name: str) -> str:
        try:
            ZoneInfo(name)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown time zone {name!r}; use an IANA name such as 'Europe/Berlin' or 'UTC'") from None
        return name


class IntelligenceSettings(_Section):
    """The optional LLM analysis hook. Off by default; amfs ships no LLM client and needs no API key."""

    provider: Literal["none"] = "none"
    analyzer: str | None = Field(
        None, description="'package.module:factory': a callable returning an InteractionAnalyzer; None = off."
    )

    @field_validator("provider", mode="before")
    @classmethod
    def _no_builtin_provider(cls, value: Any) -> Any:
        if value in (None, "", "none", "off"):
            return "none"
        raise ValueError(
            f"there is no built-in LLM provider ({value!r}); learning works without one. To add LLM analysis, "
            "set learning.intelligence.analyzer to 'package.module:factory' returning an InteractionAnalyzer"
        )


class LearningSettings(_Section):
    enabled: bool = True
    preference_learning: bool = True
    pattern_detection: bool = True
    retention_days: float = Field(90, gt=0)
    storage: StorageSettings = Field(default_factory=StorageSettings)
    confidence: ConfidenceSettings = Field(default_factory=ConfidenceSettings)
    privacy: PrivacySettings = Field(default_factory=PrivacySettings)
    patterns: PatternSettings = Field(default_factory=PatternSettings)
    intelligence: IntelligenceSettings = Field(default_factory=IntelligenceSettings)

    @model_validator(mode="before")
    @classmethod
    def _document_spelling(cls, values: Any) -> Any:
        # The document puts retention_days under storage; one value, whichever spelling is used.
        if isinstance(values, dict) and isinstance(values.get("storage"), dict):
            nested = values["storage"].get("retention_days")
            if nested is not None:
                if values.get("retention_days") not in (None, nested):
                    raise ValueError("retention_days and storage.retention_days disagree; set one of them")
                values = {**values, "retention_days": nested}
        return values

    def to_config(self) -> LearningConfig:
        """The core's plain configuration."""
        return LearningConfig(
            enabled=self.enabled,
            preference_learning=self.preference_learning,
            pattern_detection=self.pattern_detection,
            retention_days=self.retention_days,
            thresholds=Thresholds(self.confidence.suggest, self.confidence.confirm, self.confidence.auto_apply),
            anonymize=self.privacy.anonymize,
            patterns=PatternOptions(min_support=self.patterns.min_support, timezone=self.patterns.timezone),
        )


def config_path(environ: Mapping[str, str] | None = None) -> tuple[Path, bool]:
    """The config file to read and whether it was named explicitly (AMFS_CONFIG)."""
    environ = os.environ if environ is None else environ
    named = environ.get("AMFS_CONFIG")
    return (Path(named).expanduser(), True) if named else (DEFAULT_CONFIG_PATH.expanduser(), False)


def _expand(value: Any, environ: Mapping[str, str]) -> Any:
    if isinstance(value, str):
        return _ENV_REFERENCE.sub(lambda m: environ.get(m.group(1), ""), value)
    if isinstance(value, dict):
        return {k: _expand(v, environ) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand(v, environ) for v in value]
    return value


def read_config_file(path: Path, required: bool, environ: Mapping[str, str]) -> dict[str, Any]:
    """The `learning:` section of the YAML file, `${VAR}` expanded ({} when there is no file)."""
    import yaml

    if not path.exists():
        if required:
            raise ValidationError(f"AMFS_CONFIG names {path}, which does not exist. Create it or unset AMFS_CONFIG.")
        return {}
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as error:
        raise ValidationError(f"Cannot read the config file {path}: {error}") from None
    if not isinstance(document, dict):
        raise ValidationError(f"The config file {path} must be a YAML mapping (e.g. `learning: {{enabled: true}}`).")
    section = document.get("learning") or {}
    if not isinstance(section, dict):
        raise ValidationError(f"{path}: `learning:` must be a mapping of settings.")
    return _expand(section, environ)


def _set(values: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    node = values
    for part in path[:-1]:
        child = node.get(part)
        node[part] = child = dict(child) if isinstance(child, dict) else {}
        node = child
    node[path[-1]] = value


def load_learning_settings(
    environ: Mapping[str, str] | None = None,
    config_file: Path | None = None,
    *,
    enabled: bool | None = None,
    preference_learning: bool | None = None,
    pattern_detection: bool | None = None,
) -> tuple[LearningSettings, Path | None]:
    """Learning settings in force, and the config file they came from (None when there was none).

    Keyword arguments are command-line flags: None leaves the file / environment value in place.
    """
    environ = os.environ if environ is None else environ
    path, required = (config_file, True) if config_file is not None else config_path(environ)
    values = read_config_file(path, required, environ)
    source = path if path.exists() else None
    if isinstance(values.get("storage"), dict) and "retention_days" in values["storage"] and environ.get("AMFS_RETENTION_DAYS"):
        values["storage"] = {k: v for k, v in values["storage"].items() if k != "retention_days"}
    for name, field_path in ENV_OVERRIDES.items():
        if environ.get(name):
            _set(values, field_path, environ[name])
    for field_name, flag in (("enabled", enabled), ("preference_learning", preference_learning),
                             ("pattern_detection", pattern_detection)):
        if flag is not None:
            values[field_name] = flag
    try:
        return LearningSettings.model_validate(values), source
    except Exception as error:  # pydantic names the field and the problem
        where = f" (config file {source})" if source else ""
        raise ValidationError(f"Invalid learning settings{where}: {error}") from None


# -- composition ---------------------------------------------------------------------------------


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
        from ..adapters.postgres import redact_dsn

        return "postgresql", redact_dsn(settings.postgres_dsn)
    path = learning.storage.path.expanduser() if learning.storage.path else settings.data_dir / LEARNING_DB
    return "sqlite", str(path)


def build_learning_service(settings: Settings) -> LearningService:
    """The learning service over the store the settings select (not opened: it opens on first use)."""
    kind, where = learning_storage(settings)
    if kind == "postgresql":
        from ..adapters.postgres_learning import PostgresLearningStore

        store: Any = PostgresLearningStore(settings.postgres_dsn)  # type: ignore[arg-type]
    else:
        from ..adapters.sqlite_learning import SQLiteLearningStore

        store = SQLiteLearningStore(where)
    return LearningService(store, settings.learning.to_config(), analyzer=_analyzer(settings.learning.intelligence))


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


# -- `amfs-server config show` --------------------------------------------------------------------


def settings_in_force(settings: Settings, source: Path | None) -> dict[str, Any]:
    """The settings in force, secrets hidden, as plain data for `amfs-server config show`."""
    from ..adapters.postgres import redact_dsn

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
