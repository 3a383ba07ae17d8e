"""SQLite under real processes: concurrent writers lose nothing; a SIGKILL mid-stream corrupts nothing."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from amfs_server.adapters.sqlite import SQLiteStore

WRITER = textwrap.dedent(
    """
    import sys
    from amfs_server import AgentMemory
    data_dir, writer_id, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with AgentMemory(agent_id=f"agent/w{writer_id}", data_dir=data_dir, embedder="none") as mem:
        print("ready", flush=True)
        sys.stdin.readline()  # start together
        for n in range(count):
            entry = mem.write("svc", "shared", {"writer": writer_id, "n": n})
            print(f"ack {entry.version} {writer_id} {n}", flush=True)
    """
)


def _spawn(data_dir: Path, writer_id: str, count: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, str(data_dir), writer_id, str(count)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )


def _history(data_dir: Path) -> list[tuple[int, dict]]:
    async def fetch() -> list[tuple[int, dict]]:
        store = SQLiteStore(data_dir / "amfs.db")
        await store.open()
        try:
            return [(e.version, e.value) for e in await store.history("svc", "shared")]
        finally:
            await store.close()

    return asyncio.run(fetch())


def test_twenty_concurrent_writer_processes_produce_versions_1_to_20(tmp_path) -> None:
    SQLiteStore(tmp_path / "amfs.db")._open_sync()  # create the schema once, before the race
    writers = [_spawn(tmp_path, str(i), 1) for i in range(20)]
    for writer in writers:
        assert writer.stdout.readline().strip() == "ready"
    for writer in writers:
        writer.stdin.write("go\n")
        writer.stdin.flush()
    acks = []
    for writer in writers:
        out, _ = writer.communicate(timeout=120)
        assert writer.returncode == 0
        acks += [line for line in out.splitlines() if line.startswith("ack")]
    history = _history(tmp_path)
    assert [version for version, _ in history] == list(range(1, 21))
    assert sorted(value["writer"] for _, value in history) == sorted(str(i) for i in range(20))
    assert sorted(int(line.split()[1]) for line in acks) == list(range(1, 21))


def test_sigkill_mid_stream_keeps_every_acknowledged_write_and_the_store_opens(tmp_path) -> None:
    writer = _spawn(tmp_path, "k", 100_000)
    assert writer.stdout.readline().strip() == "ready"
    writer.stdin.write("go\n")
    writer.stdin.flush()
    acknowledged: list[int] = []
    deadline = time.monotonic() + 60
    while len(acknowledged) < 200 and time.monotonic() < deadline:
        line = writer.stdout.readline()
        if line.startswith("ack"):
            acknowledged.append(int(line.split()[1]))
    os.kill(writer.pid, signal.SIGKILL)
    writer.wait(timeout=30)
    assert len(acknowledged) >= 200

    conn = sqlite3.connect(tmp_path / "amfs.db")
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.close()
    versions = [version for version, _ in _history(tmp_path)]
    assert versions == list(range(1, len(versions) + 1))
    assert set(acknowledged) <= set(versions)
