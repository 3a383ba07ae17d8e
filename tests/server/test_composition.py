"""One settings model read once (file < AMFS_* environment < flags), one composition root with one clock,
and one error path for the CLI."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pytest
from click.testing import CliRunner

from amfs_server.core.errors import ValidationError
from amfs_server.server.cli import cli
from amfs_server.server.composition import build_services
from amfs_server.server.config_file import ENV_OVERRIDES
from amfs_server.server.settings import ENV_VARS, load_settings, load_settings_and_source

FIXED = datetime(2031, 1, 2, 3, 4, 5, tzinfo=timezone.utc)


def test_one_read_layers_file_environment_and_flags_for_every_section(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("learning:\n  retention_days: 30\n  preference_learning: false\n  privacy: {anonymize: true}\n")
    env = {"AMFS_CONFIG": str(path), "AMFS_RETENTION_DAYS": "14", "AMFS_DATA_DIR": str(tmp_path / "d"),
           "AMFS_AGENT_ID": "agent/env"}
    settings, source = load_settings_and_source(env, agent_id="agent/flag", learning={"preference_learning": True})
    assert source == path
    assert settings.learning.retention_days == 14  # environment over file
    assert settings.learning.privacy.anonymize is True  # file over default
    assert settings.learning.preference_learning is True  # flag over file
    assert (settings.agent_id, settings.data_dir) == ("agent/flag", tmp_path / "d")  # flag over environment
    assert load_settings(env).learning.retention_days == 14  # the environment reaches every section without the file


def test_the_learning_variables_are_the_one_maps_learning_section() -> None:
    assert ENV_OVERRIDES == {name: path[1:] for name, path in ENV_VARS.items() if path[0] == "learning"}
    assert "AMFS_RETENTION_DAYS" in ENV_OVERRIDES and "AMFS_DATA_DIR" not in ENV_OVERRIDES


def test_a_bad_value_anywhere_names_the_setting() -> None:
    with pytest.raises(ValidationError, match="retention_days"):
        load_settings({"AMFS_RETENTION_DAYS": "soon"})
    with pytest.raises(ValidationError, match="postgresql://"):
        load_settings({"AMFS_POSTGRES_DSN": "mysql://x"})


async def test_every_service_runs_on_the_one_clock_it_is_given(tmp_path: Path) -> None:
    settings = load_settings({}, data_dir=tmp_path, embedder="none")
    services = build_services(settings, learning=True, ml=True, clock=lambda: FIXED)
    assert services.memory.now() == FIXED
    assert services.learning is not None and services.learning._clock() == FIXED
    assert services.ml is not None and services.ml.ranker.clock() == FIXED
    assert services.worker is None  # no AMFS_LM_BACKBONE: no answer worker
    await services.open()
    try:
        from amfs_server.core.models import Actor
        from amfs_server.core.service import WriteRequest

        entry = await services.memory.write(Actor("agent/a", "s"), WriteRequest("svc", "k", "v"))
        assert entry.provenance.written_at == FIXED
    finally:
        await services.close()


def test_learning_follows_its_switch_unless_a_command_needs_the_stored_data(tmp_path: Path) -> None:
    off = load_settings({}, data_dir=tmp_path, embedder="none", learning={"enabled": False})
    assert build_services(off).learning is None
    assert build_services(off, learning=True).learning is not None


@pytest.mark.parametrize("args", [["memory", "search", "x"], ["memory", "forget", "svc/k"], ["config", "show"]])
def test_the_cli_reports_bad_settings_the_same_way_in_every_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("learning:\n  enabeld: false\n")
    monkeypatch.setenv("AMFS_CONFIG", str(path))
    monkeypatch.setenv("AMFS_DATA_DIR", str(tmp_path))
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1
    assert "Error: Invalid amfs-server settings" in result.output and "enabeld" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("AMFS_POSTGRES_DSN", "host=db.internal dbname=amfs user=amfs password=hunter2-Pw"),  # libpq form, refused
        ("AMFS_SESSIONS_PER_KEY", "hunter2-Pw"),
        ("AMFS_PATTERN_TIMEZONE", "hunter2-Pw"),
        # Out of range: an infinite retention crashed the server after `config show` had accepted it, and a
        # -5 byte value limit started a server that refused every write.
        ("AMFS_RETENTION_DAYS", "inf"),
        ("AMFS_RETENTION_DAYS", "999999"),
        ("AMFS_MAX_VALUE_BYTES", "-5"),
        # refused only at start before, without the variable's name
        ("AMFS_DECAY_HALF_LIFE_DAYS", "0"),
        ("AMFS_DECAY_HALF_LIFE_DAYS", "-1"),
        ("AMFS_DECAY_HALF_LIFE_DAYS", "nan"),
        ("AMFS_EMBEDDER", "hunter2-Pw"),  # a typo gave a traceback at the first write (config show accepted it)
    ],
)
def test_a_refused_setting_is_named_but_its_value_is_not_echoed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv("AMFS_DATA_DIR", str(tmp_path))
    monkeypatch.setenv(variable, value)
    result = CliRunner().invoke(cli, ["config", "show"])
    assert result.exit_code == 1 and "Invalid amfs-server settings" in result.output
    assert variable in result.output  # the user learns which variable to fix
    assert "hunter2" not in result.output


@pytest.mark.parametrize(
    ("dsn", "shown"),
    [  # a password with an unencoded '/' or '#' was taken for the host and port: printed, or a traceback
        ("postgresql://amfs:hunter2/SECRET@db.internal:5432/amfs", None),
        ("postgresql://amfs:4711#SECRET@db.internal:5432/amfs", None),
        ("postgresql://amfs:hunter2SECRET@db.internal:5432/amfs?sslmode=require", "postgresql://amfs@db.internal:5432/amfs"),
    ],
)
def test_a_dsn_password_is_never_shown_even_when_it_breaks_url_parsing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dsn: str, shown: str | None
) -> None:
    monkeypatch.setenv("AMFS_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("AMFS_POSTGRES_DSN", dsn)
    result = CliRunner().invoke(cli, ["config", "show"])
    assert "hunter2" not in result.output and "SECRET" not in result.output and "4711" not in result.output
    assert "Traceback" not in result.output
    if shown is None:
        assert result.exit_code == 1 and "percent-encode" in result.output
    else:
        assert result.exit_code == 0 and shown in result.output


@pytest.mark.parametrize(
    ("content", "message"),
    [
        # 346 bytes of nested aliases expanded to billions of values: gigabytes of memory, never an error
        ("a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
            f"{c}: &{c} [{', '.join('*' + p for _ in range(9))}]\n" for p, c in zip("abcdefgh", "bcdefghi"))
         + "learning:\n  unknown: *i\n", "more than 10000 values"),
        (b"learning:\n  enabled: \xff\xfe\n", "not UTF-8"),
        ("learning:\n" + "  " + "[" * 5000 + "]" * 5000 + "\n", "nested too deeply"),
        ("other_tool:\n  password: hunter2SECRET ]: [\nlearning: {}\n", "not valid YAML at line 2"),
    ],
)
def test_a_bad_config_file_is_a_one_line_error_that_quotes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: str | bytes, message: str
) -> None:
    path = tmp_path / "config.yaml"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    monkeypatch.setenv("AMFS_CONFIG", str(path))
    monkeypatch.setenv("AMFS_DATA_DIR", str(tmp_path))
    result = CliRunner().invoke(cli, ["config", "show"])
    assert result.exit_code == 1 and message in result.output, result.output
    assert "Traceback" not in result.output and "hunter2" not in result.output


def test_the_embedders_thread_count_is_a_setting_that_reaches_the_embedder(tmp_path: Path) -> None:
    from amfs_server.adapters.embedders import load_embedder

    assert load_settings({}).embed_threads is None  # the embedder's own default (bundled ones: default_threads())
    settings = load_settings({"AMFS_EMBED_THREADS": "2", "AMFS_DATA_DIR": str(tmp_path), "AMFS_EMBEDDER": "chat-mpnet"})
    assert settings.embed_threads == 2
    services = build_services(settings, learning=False)
    assert services.memory.embedder is load_embedder("chat-mpnet", 2)
    # on a CPU without VNNI the default (auto) asks with a second, mixed session: it gets the same threads
    sides = [getattr(services.memory.embedder, side, services.memory.embedder) for side in ("documents", "queries")]
    assert [side.num_threads for side in sides] == [2, 2]
    assert load_embedder("chat-mpnet", 1, query_encoder="full").num_threads == 1
    for bad in ("0", "two", "1.5"):
        with pytest.raises(ValidationError, match="embed_threads"):
            load_settings({"AMFS_EMBED_THREADS": bad})
