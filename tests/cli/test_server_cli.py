"""`amfs-server --version`, `--log-level` / AMFS_LOG_LEVEL, `memory show --json` and `memory search`."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

import amfs_server
from amfs_server import AgentMemory
from amfs_server.core.models import AMFS_VERSION
from amfs_server.server.cli import cli
from amfs_server.session_bench.mcp_latency import server_env

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
# `amfs-server` with nothing importable outside the default install (tests/server/default_install.py).
SERVER_COMMAND = [sys.executable, str(Path(__file__).resolve().parents[1] / "server" / "default_install.py")]


def test_version_prints_the_package_version() -> None:
    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0 and result.output == f"amfs-server {AMFS_VERSION}\n"


def test_the_version_string_agrees_everywhere_it_is_read() -> None:
    # pyproject.toml must carry a literal version for the build; the code reads AMFS_VERSION
    assert tomllib.loads(PYPROJECT.read_text())["project"]["version"] == AMFS_VERSION == amfs_server.__version__


def stdio_server_log(tmp_path: Path, *args: str, **env: str) -> str:
    """stderr of a stdio server that starts, finds stdin closed and exits."""
    result = subprocess.run(
        [*SERVER_COMMAND, *args], env=server_env(tmp_path / "data", AMFS_EMBEDDER="none", **env),
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    return result.stderr


def test_log_level_debug_logs_debug_lines_and_warning_hides_them(tmp_path: Path) -> None:
    debug = stdio_server_log(tmp_path, "--log-level", "debug")
    assert f"DEBUG amfs_server.server: amfs-server {AMFS_VERSION}: transport=stdio" in debug
    quiet = stdio_server_log(tmp_path, AMFS_LOG_LEVEL="warning")
    assert " DEBUG " not in quiet and " INFO " not in quiet


@pytest.mark.parametrize("args, env", [(["--log-level", "loud"], {}), ([], {"AMFS_LOG_LEVEL": "verbose"})])
def test_a_bad_log_level_is_refused_naming_the_choices(args: list[str], env: dict[str, str]) -> None:
    result = CliRunner().invoke(cli, [*args, "memory", "show"], env=env)
    assert result.exit_code == 2
    assert "--log-level" in result.output and "'debug', 'info', 'warning', 'error'" in result.output


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    data_dir = tmp_path / "store"
    monkeypatch.setenv("AMFS_DATA_DIR", str(data_dir))
    monkeypatch.setenv("AMFS_EMBEDDER", "none")
    with AgentMemory(agent_id="agent/cli", data_dir=data_dir, embedder="none") as mem:
        mem.write("checkout-service", "retry-pattern", "retry payments with exponential backoff", confidence=0.85)
        mem.write("checkout-service", "timeouts", {"connect_ms": 500, "notes": "x" * 300})
        mem.write("search-service", "reindex", "rebuild the search index nightly")
    return data_dir


def test_memory_show_json_is_one_document_with_the_entries_of_the_table(store: Path) -> None:
    table = CliRunner().invoke(cli, ["memory", "show", "--limit", "2"])
    shown = CliRunner().invoke(cli, ["memory", "show", "--limit", "2", "--json"])
    assert shown.exit_code == 0, shown.output
    document = json.loads(shown.output)
    memories = document["memories"]
    assert memories["count"] == 3 and memories["more"] is True
    keys = [entry["entry_key"] for entry in memories["entries"]]
    assert keys == [line.split()[1] for line in table.output.splitlines() if line.startswith("- ")][:2]
    assert memories["entries"][1]["value"] == {"connect_ms": 500, "notes": "x" * 300}  # whole, unlike the table
    assert document["preferences"]["entries"] == [] and document["patterns"]["entries"] == []


def test_memory_search_runs_retrieval_and_prints_ranked_hits(store: Path) -> None:
    result = CliRunner().invoke(cli, ["memory", "search", "how do we retry payments?"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[1].startswith("1. checkout-service/retry-pattern v1 score=")
    assert "search-service/reindex" not in result.output
    scoped = CliRunner().invoke(cli, ["memory", "search", "nightly", "--entity-path", "search-service", "--json"])
    found = json.loads(scoped.output)
    assert [hit["entry"]["entry_key"] for hit in found["results"]] == ["search-service/reindex"]


def test_memory_search_counts_as_a_read_of_its_own_cli_session(store: Path) -> None:
    CliRunner().invoke(cli, ["memory", "search", "retry payments", "--limit", "1"])
    with AgentMemory(agent_id="agent/check", data_dir=store, embedder="none") as mem:
        assert mem.read("checkout-service", "retry-pattern").recall_count == 2  # the search, then this read


@pytest.mark.parametrize("args", [["--limit", "0"], ["--limit", "101"]])
def test_memory_search_refuses_a_limit_out_of_range(store: Path, args: list[str]) -> None:
    result = CliRunner().invoke(cli, ["memory", "search", "retry", *args])
    assert result.exit_code == 2 and "--limit" in result.output


def test_a_benchmark_needing_an_extra_says_which_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    """Red-team repro: `amfs-server bench session` on the default install ended in ModuleNotFoundError: torch."""
    from amfs_server.session_bench import session_bench

    def needs_torch(argv: list[str]) -> None:
        raise ModuleNotFoundError("No module named 'torch'", name="torch")

    monkeypatch.setattr(session_bench, "main", needs_torch)
    result = CliRunner().invoke(cli, ["bench", "session", "--modes", "rag"])
    assert result.exit_code == 1
    assert "needs torch, which is not installed: pip install '.[lm]' (in the amfs-server checkout)" in result.output
    assert "Traceback" not in result.output

    def needs_something_else(argv: list[str]) -> None:
        raise ModuleNotFoundError("No module named 'amfs_server.nowhere'", name="amfs_server.nowhere")

    monkeypatch.setattr(session_bench, "main", needs_something_else)
    assert isinstance(CliRunner().invoke(cli, ["bench", "session"]).exception, ModuleNotFoundError)  # a bug: raised
