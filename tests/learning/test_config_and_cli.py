"""Learning settings (YAML file < AMFS_* environment < flags), `amfs-server config show`, `serve`'s off
switches, and the `memory` commands over learned data (show, forget, export / import, clear)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from amfs_server.adapters.sqlite_learning import SQLiteLearningStore
from amfs_server.core.errors import ValidationError
from amfs_server.core.learning import LearningService
from amfs_server.core.models import Actor
from amfs_server.server.cli import cli
from amfs_server.server.config_file import build_learning_service, load_learning_settings
from amfs_server.server.settings import load_settings

DOCUMENT_CONFIG = """
learning:
  enabled: true
  storage:
    type: sqlite
    path: {path}
    retention_days: 30
  confidence:
    suggest: 0.25
    confirm: 0.5
    auto_apply: 0.9
  privacy:
    anonymize: true
    cloud_sync: false
server_section_of_someone_else: {{ignored: true}}
"""
SECRET = "ghp_1A2b3C4d5E6f7G8h9I0jK1lM2nO3pQ4rS5tU"


@pytest.fixture(autouse=True)
def clean_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    import os

    for name in list(os.environ):
        if name.startswith("AMFS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.amfs/config.yaml
    data_dir = tmp_path / "store"
    monkeypatch.setenv("AMFS_DATA_DIR", str(data_dir))
    monkeypatch.setenv("AMFS_EMBEDDER", "none")
    return data_dir


def write_config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


# -- settings ---------------------------------------------------------------------------------------


def test_the_documents_yaml_layout_is_read_and_environment_and_flags_override_it(tmp_path: Path) -> None:
    path = write_config(tmp_path, DOCUMENT_CONFIG.format(path=tmp_path / "l.db"))
    settings, source = load_learning_settings({"AMFS_CONFIG": str(path)})
    assert source == path
    assert (settings.retention_days, settings.privacy.anonymize, settings.storage.path) == (30, True, tmp_path / "l.db")
    assert settings.to_config().thresholds.action_for(0.85) == "confirm"
    env = {"AMFS_CONFIG": str(path), "AMFS_RETENTION_DAYS": "7", "AMFS_CONFIDENCE_AUTO_APPLY": "0.8",
           "AMFS_LEARNING_ENABLED": "false", "AMFS_ANONYMIZE": "off", "AMFS_PATTERN_DETECTION": "0"}
    overridden, _ = load_learning_settings(env)
    assert (overridden.retention_days, overridden.enabled, overridden.privacy.anonymize) == (7, False, False)
    assert overridden.pattern_detection is False and overridden.confidence.auto_apply == 0.8
    flagged, _ = load_learning_settings({"AMFS_CONFIG": str(path)}, enabled=False, preference_learning=False)
    assert (flagged.enabled, flagged.preference_learning, flagged.pattern_detection) == (False, False, True)


def test_defaults_without_a_file_and_env_references_in_the_file(tmp_path: Path) -> None:
    settings, source = load_learning_settings({})
    assert source is None and settings.enabled and settings.retention_days == 90
    assert settings.confidence.suggest == 0.3 and settings.storage.type == "auto"
    path = write_config(tmp_path, "learning:\n  storage:\n    path: ${LEARN_DIR}/x.db\n")
    referenced, _ = load_learning_settings({"AMFS_CONFIG": str(path), "LEARN_DIR": "/srv/amfs"})
    assert referenced.storage.path == Path("/srv/amfs/x.db")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("learning:\n  enabeld: false\n", "enabeld"),
        ("learning:\n  confidence: {suggest: 0.7, confirm: 0.6}\n", "suggest <= confirm <= auto_apply"),
        ("learning:\n  intelligence: {provider: openai}\n", "no built-in LLM provider"),
        ("learning:\n  privacy: {cloud_sync: true}\n", "cloud_sync"),
        ("learning:\n  retention_days: 0\n", "retention_days"),
        ("learning: [1, 2]\n", "must be a mapping"),
        ("learning:\n  patterns: {timezone: Mars/Olympus}\n", "unknown time zone"),
    ],
)
def test_bad_settings_are_refused_with_the_reason(tmp_path: Path, text: str, message: str) -> None:
    path = write_config(tmp_path, text)
    with pytest.raises(ValidationError, match=message):
        load_learning_settings({"AMFS_CONFIG": str(path)})


def test_a_named_config_file_that_does_not_exist_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="does not exist"):
        load_learning_settings({"AMFS_CONFIG": str(tmp_path / "missing.yaml")})


def test_storage_follows_the_server_store_unless_told_otherwise(tmp_path: Path) -> None:
    dsn = "postgresql://u:pw@localhost:5432/amfs"
    assert build_learning_service(load_settings({}, data_dir=tmp_path)).store.name == "sqlite"
    assert build_learning_service(load_settings({}, data_dir=tmp_path, postgres_dsn=dsn)).store.name == "postgres"
    sqlite_learning, _ = load_learning_settings({"AMFS_LEARNING_STORAGE": "sqlite"})
    assert build_learning_service(load_settings({}, data_dir=tmp_path, postgres_dsn=dsn, learning=sqlite_learning)).store.name == "sqlite"
    pg_learning, _ = load_learning_settings({"AMFS_LEARNING_STORAGE": "postgres"})
    with pytest.raises(ValidationError, match="AMFS_POSTGRES_DSN"):
        build_learning_service(load_settings({}, data_dir=tmp_path, learning=pg_learning))


# -- CLI: config show and serve's switches ----------------------------------------------------------


def test_config_show_prints_the_settings_in_force_with_secrets_hidden(tmp_path: Path, monkeypatch) -> None:
    path = write_config(tmp_path, DOCUMENT_CONFIG.format(path=tmp_path / "l.db"))
    monkeypatch.setenv("AMFS_CONFIG", str(path))
    monkeypatch.setenv("AMFS_RETENTION_DAYS", "14")
    monkeypatch.setenv("AMFS_POSTGRES_DSN", "postgresql://amfs:s3cretpw@db:5432/amfs")
    monkeypatch.setenv("AMFS_LEARNING_STORAGE", "sqlite")
    monkeypatch.setenv("AMFS_API_KEYS", "abcdefghijklmnop0123")
    result = CliRunner().invoke(cli, ["config", "show"])
    assert result.exit_code == 0, result.output
    assert f"config_file: {path}" in result.output
    for needle in ("retention_days: 14.0", "anonymize: true", "auto_apply: 0.9", f"path: {tmp_path / 'l.db'}",
                   "postgresql://amfs@db:5432/amfs (password hidden)", "api_keys: (set, hidden)"):
        assert needle in result.output, needle
    assert "s3cretpw" not in result.output and "abcdefghijklmnop0123" not in result.output


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ([], (True, True, True)),
        (["--no-learning"], (False, True, True)),
        (["--no-preference-learning", "--no-pattern-detection"], (True, False, False)),
    ],
)
def test_serve_passes_the_off_switches_to_the_server(monkeypatch, flags: list[str], expected: tuple) -> None:
    captured: dict[str, Any] = {}
    monkeypatch.setattr("amfs_server.server.app.run_server", lambda settings, **kw: captured.update(settings=settings, **kw))
    result = CliRunner().invoke(cli, ["serve", *flags])
    assert result.exit_code == 0, result.output
    learning = captured["settings"].learning
    assert (learning.enabled, learning.preference_learning, learning.pattern_detection) == expected
    assert captured["transport"] == "stdio"


# -- CLI: the memory commands over learned data -------------------------------------------------------


def learn(data_dir: Path) -> None:
    """Interactions, preferences and patterns in the CLI's learning store, as a server would leave them."""

    async def main() -> None:
        learning = LearningService(SQLiteLearningStore(data_dir / "learning.db"))
        actor = Actor("agent/cli", "session-1")
        for n in range(5):  # in two sessions: a habit of one session only is never applied
            await learning.record_interaction(
                actor if n < 2 else Actor("agent/cli", "session-2"), "format_code", {"style": "black", "token": SECRET}
            )
        await learning.set_preference(actor.agent_id, "code_formatting", "line_length", 120)
        for day in range(3):
            session = Actor("agent/cli", f"day-{day}")
            for tool in ("github_create_issue", "github_add_labels", "github_assign"):
                await learning.record_interaction(session, tool, {"labels": ["bug"]} if tool == "github_add_labels" else {})
        await learning.close()

    asyncio.run(main())


def test_memory_show_lists_learned_preferences_and_detected_patterns(clean_env: Path) -> None:
    learn(clean_env)
    result = CliRunner().invoke(cli, ["memory", "show"])
    assert result.exit_code == 0, result.output
    assert "Memories (0):" in result.output and "Learned preferences (" in result.output
    assert "- format_code.style: \"black\" (confidence: 0.86, action: auto_apply, samples: 5, user: agent/cli)" in result.output
    assert "- code_formatting.line_length: 120 (confidence: 0.40, action: suggest" in result.output
    assert "workflow github_create_issue -> github_add_labels -> github_assign (3/3 uses)" in result.output
    assert SECRET not in result.output


def test_memory_forget_removes_a_preference_by_category_dot_key(clean_env: Path) -> None:
    learn(clean_env)
    result = CliRunner().invoke(cli, ["memory", "forget", "code_formatting.line_length"])
    assert result.exit_code == 0, result.output
    assert "Forgot preference code_formatting.line_length (1 user)." in result.output
    shown = CliRunner().invoke(cli, ["memory", "show"]).output
    assert "code_formatting.line_length" not in shown and "format_code.style" in shown
    missing = CliRunner().invoke(cli, ["memory", "forget", "code_formatting.line_length", "--user", "agent/cli"])
    assert missing.exit_code != 0 and "nothing was forgotten" in missing.output


def test_memory_export_import_round_trip_covers_learned_data_and_clear_removes_it(clean_env: Path, tmp_path: Path, monkeypatch) -> None:
    learn(clean_env)
    runner = CliRunner()
    assert runner.invoke(cli, ["memory", "show"]).exit_code == 0  # detects the patterns
    exported = runner.invoke(cli, ["memory", "export"])
    assert exported.exit_code == 0, exported.output
    document = json.loads(exported.output)
    counts = {k: len(v) for k, v in document["extra"].items()}
    assert counts["interactions"] == 14 and counts["preferences"] == 3 and counts["patterns"] >= 3
    assert SECRET not in exported.output
    backup = tmp_path / "backup.json"
    backup.write_text(exported.output)

    monkeypatch.setenv("AMFS_DATA_DIR", str(tmp_path / "fresh"))
    imported = runner.invoke(cli, ["memory", "import", str(backup)])
    assert imported.exit_code == 0, imported.output
    assert f"Imported 14 interactions, 3 preferences, {counts['patterns']} patterns." in imported.output
    again = json.loads(runner.invoke(cli, ["memory", "export"]).output)
    assert again["extra"] == document["extra"]
    refused = runner.invoke(cli, ["memory", "import", str(backup)])
    assert refused.exit_code != 0 and "refuses to overwrite" in refused.output

    assert "workflow github_create_issue" in runner.invoke(cli, ["memory", "show"]).output
    cleared = runner.invoke(cli, ["memory", "clear", "--yes"])
    assert cleared.exit_code == 0
    after = json.loads(runner.invoke(cli, ["memory", "export"]).output)
    assert after["extra"] == {"interactions": [], "preferences": [], "patterns": []}
