"""One settings model, read once at a composition root (`server.composition.build_services`).

Precedence, lowest first: defaults, the YAML config file (`AMFS_CONFIG`, else `~/.amfs/config.yaml` when
it exists), `AMFS_*` environment variables (`ENV_VARS`, the one map of them), then command-line flags and
SDK arguments. `${VAR}` in a string value of the file is replaced by that environment variable. The file
holds the `learning:` section; unknown keys under it are refused (a typo must not silently turn a privacy
switch off); other top-level sections belong to other tools and are left alone.

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

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic import ValidationError as PydanticValidationError

from ..core.embedding import DEFAULT_EMBEDDER
from ..core.errors import ValidationError
from ..core.learning import LearningConfig, Thresholds
from ..core.patterns import PatternOptions
from .limits import ServerLimits

LOG_LEVELS = ("debug", "info", "warning", "error")
"""The values of `amfs-server --log-level` / AMFS_LOG_LEVEL."""
DEFAULT_CONFIG_PATH = Path("~/.amfs/config.yaml")

MAX_RETENTION_DAYS = 100 * 365  # a century stands for "keep": a cut-off date is computed from it, so it must be finite
MAX_CONFIG_NODES = 10_000

ENV_VARS: dict[str, tuple[str, ...]] = {
    "AMFS_DATA_DIR": ("data_dir",),
    "AMFS_POSTGRES_DSN": ("postgres_dsn",),
    "AMFS_AGENT_ID": ("agent_id",),
    "AMFS_DECAY_HALF_LIFE_DAYS": ("decay_half_life_days",),
    "AMFS_MAX_VALUE_BYTES": ("max_value_bytes",),
    "AMFS_EMBEDDER": ("embedder",),
    "AMFS_EMBED_THREADS": ("embed_threads",),
    "AMFS_QUERY_ENCODER": ("query_encoder",),
    "AMFS_FUSION": ("fusion",),
    "AMFS_ML_MODEL_DIR": ("ml_model_dir",),
    "AMFS_API_KEYS": ("api_keys",),
    "AMFS_ALLOWED_ORIGINS": ("allowed_origins",),
    "AMFS_LM_BACKBONE": ("lm_backbone",),
    "AMFS_SESSIONS_PER_KEY": ("sessions_per_key",),
    "AMFS_CALLS_PER_KEY": ("calls_per_key",),
    "AMFS_MAX_RESPONSE_BYTES": ("max_response_bytes",),
    "AMFS_HEADER_TIMEOUT_S": ("header_timeout_s",),
    "AMFS_LEARNING_ENABLED": ("learning", "enabled"),
    "AMFS_PREFERENCE_LEARNING": ("learning", "preference_learning"),
    "AMFS_PATTERN_DETECTION": ("learning", "pattern_detection"),
    "AMFS_RETENTION_DAYS": ("learning", "retention_days"),
    "AMFS_LEARNING_STORAGE": ("learning", "storage", "type"),
    "AMFS_LEARNING_PATH": ("learning", "storage", "path"),
    "AMFS_CONFIDENCE_SUGGEST": ("learning", "confidence", "suggest"),
    "AMFS_CONFIDENCE_CONFIRM": ("learning", "confidence", "confirm"),
    "AMFS_CONFIDENCE_AUTO_APPLY": ("learning", "confidence", "auto_apply"),
    "AMFS_ANONYMIZE": ("learning", "privacy", "anonymize"),
    "AMFS_PATTERN_MIN_SUPPORT": ("learning", "patterns", "min_support"),
    "AMFS_PATTERN_TIMEZONE": ("learning", "patterns", "timezone"),
}
"""Every `AMFS_*` variable that sets a setting, and the setting's path in `Settings`."""
_ENV_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


# -- the learning section ------------------------------------------------------------------------


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StorageSettings(_Section):
    type: Literal["auto", "sqlite", "postgresql"] = "auto"
    """auto: PostgreSQL when the server uses it (AMFS_POSTGRES_DSN), else SQLite."""
    path: Path | None = None
    retention_days: float | None = Field(
        None, gt=0, le=MAX_RETENTION_DAYS, description="The document's spelling of learning.retention_days."
    )

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
            raise ValueError("unknown time zone; use an IANA name such as 'Europe/Berlin' or 'UTC'") from None
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
            "there is no built-in LLM provider; learning works without one. To add LLM analysis, "
            "set learning.intelligence.analyzer to 'package.module:factory' returning an InteractionAnalyzer"
        )


class LearningSettings(_Section):
    enabled: bool = True
    preference_learning: bool = True
    pattern_detection: bool = True
    retention_days: float = Field(90, gt=0, le=MAX_RETENTION_DAYS)  # finite: a cut-off date is computed from it
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


# -- the model --------------------------------------------------------------------------------------


class Settings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    data_dir: Path = Field(default_factory=lambda: Path.home() / ".amfs")
    postgres_dsn: str | None = None
    agent_id: str | None = None
    decay_half_life_days: float | None = Field(None, gt=0, allow_inf_nan=False)
    max_value_bytes: int = Field(1024 * 1024, ge=1)
    embedder: str | None = DEFAULT_EMBEDDER
    embed_threads: int | None = Field(None, ge=1, le=256)
    """Intra-op threads the embedder computes one text on; None: its default (two where two cores are free, for the
    bundled embedders: `adapters.onnx_embedder.default_threads`)."""
    query_encoder: Literal["auto", "full", "mixed", "fast"] = "auto"  # adapters.embedders.DEFAULT_QUERY_ENCODER
    """What embeds a retrieve's question (`adapters.embedders.QUERY_ENCODERS`): the embedder itself (full), itself on
    faster kernels (mixed), `auto` (mixed on a CPU without VNNI, else full) or its distilled question side (fast).
    Stored vectors are the embedder's either way."""
    fusion: Literal["hybrid", "rrf"] = "hybrid"
    """How `amfs_retrieve` fuses its strategies: the score-aware default, or the seed's weighted Reciprocal Rank Fusion
    (0.4 semantic, 0.2 keyword, 0.2 temporal, 0.2 confidence; `core.retrieval.RRF_WEIGHTS`)."""
    ml_model_dir: Path | None = None
    """Where ML exports go (models themselves live in the store); None: `<data_dir>/ml`, see `ml_dir`."""
    api_keys: str | None = None
    allowed_origins: str | None = None
    lm_backbone: str | None = None
    sessions_per_key: int = Field(32, ge=1)
    calls_per_key: int = Field(4, ge=1)
    max_response_bytes: int = Field(16 * 1024 * 1024, ge=1024)
    header_timeout_s: float = Field(10.0, gt=0, le=3600)
    learning: LearningSettings = Field(default_factory=LearningSettings)
    """The config file's `learning:` section, with its environment variables and flags."""

    @field_validator("postgres_dsn")
    @classmethod
    def _dsn_scheme(cls, dsn: str | None) -> str | None:
        if not dsn:
            return None
        if not dsn.startswith(("postgresql://", "postgres://")):
            raise ValueError("AMFS_POSTGRES_DSN must be a postgresql:// URL, e.g. postgresql://user@host:5432/amfs")
        userinfo = dsn.partition("://")[2].rpartition("@")[0]
        if any(char in userinfo for char in "/?#"):  # parsers would take part of the password for the host
            raise ValueError(
                "AMFS_POSTGRES_DSN: the user or password holds '/', '?' or '#'; percent-encode them (%2F, %3F, %23)"
            )
        return dsn

    @field_validator("embedder")
    @classmethod
    def _embedder_none(cls, name: str | None) -> str | None:
        if name is None or name.strip().lower() in {"", "none", "off"}:
            return None
        from ..adapters.embedders import EMBEDDER_CHOICES, canonical_embedder

        if canonical_embedder(name) is None:  # a typo fails here, in one line, not as a traceback at the first write
            raise ValueError(f"not an embedder this server knows; {EMBEDDER_CHOICES}")
        return name

    @model_validator(mode="after")
    def _fast_query_side_exists(self) -> Settings:
        from ..adapters.embedders import canonical_embedder, check_query_encoder

        if self.embedder is not None:
            check_query_encoder(canonical_embedder(self.embedder) or self.embedder, self.query_encoder)
        return self

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


# -- reading: file < environment < flags -------------------------------------------------------------


def config_path(environ: Mapping[str, str] | None = None) -> tuple[Path, bool]:
    """The config file to read and whether it was named explicitly (AMFS_CONFIG)."""
    environ = os.environ if environ is None else environ
    named = environ.get("AMFS_CONFIG")
    return (Path(named).expanduser(), True) if named else (DEFAULT_CONFIG_PATH.expanduser(), False)


def _expand(value: Any, environ: Mapping[str, str], budget: list[int] | None = None) -> Any:
    """`${VAR}` expanded in every string. YAML aliases share nodes that this copies, so a few hundred bytes of
    nested aliases would expand to billions of nodes: more than MAX_CONFIG_NODES is refused."""
    budget = [MAX_CONFIG_NODES] if budget is None else budget
    budget[0] -= 1
    if budget[0] < 0:
        raise ValidationError(
            f"The config file's learning section has more than {MAX_CONFIG_NODES} values (nested YAML aliases?)."
        )
    if isinstance(value, str):
        return _ENV_REFERENCE.sub(lambda m: environ.get(m.group(1), ""), value)
    if isinstance(value, dict):
        return {k: _expand(v, environ, budget) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand(v, environ, budget) for v in value]
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
    except yaml.YAMLError as error:
        # Where, not what: the file may be shared with other tools, and the offending line may hold a secret.
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ValidationError(f"The config file {path} is not valid YAML{where}.") from None
    except UnicodeDecodeError:
        raise ValidationError(f"The config file {path} is not UTF-8 text.") from None
    except RecursionError:
        raise ValidationError(f"The config file {path} is nested too deeply to read.") from None
    except OSError as error:
        raise ValidationError(f"Cannot read the config file {path}: {error.strerror or error}") from None
    if not isinstance(document, dict):
        raise ValidationError(f"The config file {path} must be a YAML mapping (e.g. `learning: {{enabled: true}}`).")
    section = document.get("learning") or {}
    if not isinstance(section, dict):
        raise ValidationError(f"{path}: `learning:` must be a mapping of settings.")
    return _expand(section, environ)


def load_settings(environ: Mapping[str, str] | None = None, *, config_file: Path | bool = False, **overrides: Any) -> Settings:
    """Settings from the environment and `overrides` (CLI flags, SDK arguments; None: not given), over the
    config file when `config_file` says to read it (True: AMFS_CONFIG or the default path; a path: that file)."""
    return load_settings_and_source(environ, config_file=config_file, **overrides)[0]


def load_settings_and_source(
    environ: Mapping[str, str] | None = None, *, config_file: Path | bool = True, **overrides: Any
) -> tuple[Settings, Path | None]:
    """The settings in force and the config file they came from (None when none was read).

    An override for a section is a mapping merged into it (`learning={"enabled": False}`) or the whole
    section (`learning=LearningSettings(...)`)."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    source: Path | None = None
    if config_file is not False:
        path, required = (config_file, True) if isinstance(config_file, Path) else config_path(environ)
        learning = read_config_file(path, required, environ)
        source = path if path.exists() else None
        # One retention value: the variable replaces the file's, whichever of the file's spellings it used.
        if isinstance(learning.get("storage"), dict) and environ.get("AMFS_RETENTION_DAYS"):
            learning["storage"] = {k: v for k, v in learning["storage"].items() if k != "retention_days"}
        if learning:
            values["learning"] = learning
    for name, field_path in ENV_VARS.items():
        if environ.get(name):
            _set(values, field_path, environ[name])
    _merge(values, {name: value for name, value in overrides.items() if value is not None})
    try:
        return Settings.model_validate(values), source
    except PydanticValidationError as error:
        where = f" (config file {source})" if source else ""
        raise ValidationError(f"Invalid amfs-server settings{where}: {settings_problems(error)}") from None


def settings_problems(error: PydanticValidationError) -> str:
    """Each problem as `field: message`, without the value given: a setting may hold a secret (a DSN's password,
    API keys), and this message goes to stderr and container logs."""
    variables = {field_path: name for name, field_path in ENV_VARS.items()}

    def field(loc: tuple[Any, ...]) -> str:
        name = ".".join(str(part) for part in loc) or "settings"
        return f"{name} ({variables[loc]})" if loc in variables else name

    return "; ".join(
        f"{field(tuple(problem['loc']))}: {problem['msg']}"
        for problem in error.errors(include_url=False, include_input=False)
    )


def load_learning_settings(
    environ: Mapping[str, str] | None = None,
    config_file: Path | None = None,
    *,
    enabled: bool | None = None,
    preference_learning: bool | None = None,
    pattern_detection: bool | None = None,
) -> tuple[LearningSettings, Path | None]:
    """The learning section in force and its config file: `load_settings_and_source`'s, with the flags."""
    flags = {"enabled": enabled, "preference_learning": preference_learning, "pattern_detection": pattern_detection}
    settings, source = load_settings_and_source(
        environ, config_file=True if config_file is None else config_file,
        learning={name: flag for name, flag in flags.items() if flag is not None},
    )
    return settings.learning, source


def _set(values: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    node = values
    for part in path[:-1]:
        child = node.get(part)
        node[part] = child = dict(child) if isinstance(child, dict) else {}
        node = child
    node[path[-1]] = value


def _merge(values: dict[str, Any], overrides: Mapping[str, Any]) -> None:
    """Deep-merge `overrides` into `values`: a mapping merges into a section, anything else replaces."""
    for name, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(values.get(name), dict):
            _merge(values[name], value)
        elif isinstance(value, Mapping):
            values[name] = dict(value)
        else:
            values[name] = value
