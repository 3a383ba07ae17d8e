"""Several processes sharing one PostgreSQL store (AMFS_POSTGRES_DSN), each through the real composition root.

Each worker is a separate Python process built like the server and the SDK build theirs
(`load_settings()` -> `build_service()` -> `create_store()`), with AMFS_POSTGRES_DSN pointing at the test
database and a fresh schema named in the DSN (`?options=-csearch_path%3D<schema>`). Workers keep their
store open and take JSON commands on stdin, one per line, answering one JSON line each, so the test can
release many of them at the same moment.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

POSTGRES_DSN = os.environ.get("AMFS_TEST_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/test")
WORKER_TIMEOUT_S = 120

WORKER = r'''
import asyncio, json, sys

from amfs_server.core.errors import AmfsError
from amfs_server.core.models import Actor
from amfs_server.core.service import WriteRequest
from amfs_server.server.composition import build_service
from amfs_server.server.settings import load_settings


async def main() -> None:
    service = build_service(load_settings())
    actor = Actor(sys.argv[1], sys.argv[2])
    await service.open()
    print(json.dumps({"ready": service.store.name, "schema": getattr(service.store, "schema", None)}), flush=True)
    loop = asyncio.get_running_loop()
    try:
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                return
            cmd = json.loads(line)
            op = cmd.pop("op")
            try:
                if op == "write":
                    result = (await service.write(actor, WriteRequest(**cmd))).to_dict(include_embedding=False)
                elif op == "read":
                    result = (await service.read(actor, cmd["entity_path"], cmd["key"])).to_dict(include_embedding=False)
                elif op == "history":
                    result = [e.to_dict(include_embedding=False) for e in await service.history(cmd["entity_path"], cmd["key"])]
                elif op == "outcome":
                    record = await service.commit_outcome(actor, cmd["ref"], cmd["type"], cmd.get("keys"))
                    result = dict(record.to_dict(), already_applied=record.already_applied)
                elif op == "outcomes":
                    result = [r.to_dict() for r in await service.outcome_records(cmd.get("entity_path"))]
                elif op == "quit":
                    return
                else:
                    raise ValueError(f"unknown op {op!r}")
                print(json.dumps({"ok": result}), flush=True)
            except AmfsError as error:
                print(json.dumps({"error": f"{type(error).__name__}: {error}"}), flush=True)
    finally:
        await service.close()


asyncio.run(main())
'''


def _postgres_unavailable_reason() -> str | None:
    """Same probe as tests/conftest.py (conftest is not importable under --import-mode=importlib)."""
    try:
        import asyncpg

        async def probe() -> None:
            conn = await asyncpg.connect(POSTGRES_DSN, timeout=5)
            try:
                await conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
            finally:
                await conn.close()

        asyncio.run(probe())
        return None
    except Exception as error:  # any failure means: skip
        return f"{type(error).__name__}: {error}"


@pytest.fixture(scope="module")
def pg_dsn() -> str:
    reason = _postgres_unavailable_reason()
    if reason:
        pytest.skip(f"PostgreSQL with pgvector unavailable: {reason}")
    return POSTGRES_DSN


@pytest.fixture
def shared_dsn(pg_dsn: str) -> Any:
    """The test DSN with a fresh schema named the libpq way (`options=-csearch_path=<schema>`); dropped after."""
    schema = f"amfs_mp_{uuid.uuid4().hex[:12]}"
    separator = "&" if "?" in pg_dsn else "?"
    yield f"{pg_dsn}{separator}options={quote(f'-csearch_path={schema}', safe='')}", schema

    import asyncpg

    async def drop() -> None:
        conn = await asyncpg.connect(pg_dsn, timeout=10)
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await conn.close()

    asyncio.run(drop())


class Worker:
    def __init__(self, script: Path, dsn: str, data_dir: Path, agent_id: str, session_id: str) -> None:
        env = dict(os.environ)
        env.update(
            AMFS_POSTGRES_DSN=dsn,
            AMFS_EMBEDDER="none",
            AMFS_DATA_DIR=str(data_dir),  # must stay unused: the store is PostgreSQL
        )
        env.pop("AMFS_API_KEYS", None)
        self.proc = subprocess.Popen(
            [sys.executable, str(script), agent_id, session_id],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )

    def receive(self) -> dict[str, Any]:
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        if not line:
            self.proc.wait(timeout=WORKER_TIMEOUT_S)
            raise AssertionError(f"worker exited ({self.proc.returncode}): {self.proc.stderr.read()}")  # type: ignore[union-attr]
        return json.loads(line)

    def send(self, op: str, **args: Any) -> None:
        self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]

    def call(self, op: str, **args: Any) -> Any:
        self.send(op, **args)
        answer = self.receive()
        assert "ok" in answer, answer
        return answer["ok"]

    def request_stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.send("quit")
            except OSError:
                pass

    def wait_stopped(self) -> None:
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for stream in (self.proc.stdout, self.proc.stderr, self.proc.stdin):
            if stream:
                stream.close()


@pytest.fixture
def workers(tmp_path: Path, shared_dsn: Any) -> Any:
    dsn, schema = shared_dsn
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    started: list[Worker] = []

    def start(count: int) -> list[Worker]:
        batch = [
            Worker(script, dsn, tmp_path / f"data-{len(started) + i}", f"agent/w{len(started) + i}", f"session-{uuid.uuid4().hex[:8]}")
            for i in range(count)
        ]
        started.extend(batch)
        for worker in batch:  # every worker has opened the shared store before any command goes out
            ready = worker.receive()
            assert ready == {"ready": "postgres", "schema": schema}, ready
        return batch

    yield start
    for worker in started:
        worker.request_stop()
    for worker in started:
        worker.wait_stopped()
    assert not any(p.exists() for p in tmp_path.glob("data-*/amfs.db")), "a worker fell back to SQLite"


def test_two_processes_see_each_others_writes_versions_and_outcomes(workers: Any) -> None:
    a, b = workers(2)

    first = a.call("write", entity_path="team/checkout", key="retry", value={"tries": 3, "backoff": "exp"})
    assert first["version"] == 1

    seen = b.call("read", entity_path="team/checkout", key="retry")
    assert seen["value"] == {"tries": 3, "backoff": "exp"}
    assert list(seen["value"]) == ["tries", "backoff"]
    assert seen["provenance"]["agent_id"] == "agent/w0"

    second = b.call("write", entity_path="team/checkout", key="retry", value={"tries": 5})
    assert second["version"] == 2
    history = a.call("history", entity_path="team/checkout", key="retry")
    assert [(h["version"], h["provenance"]["agent_id"]) for h in history] == [(1, "agent/w0"), (2, "agent/w1")]

    # b read v1 in its session; the outcome applies to the key's current version (v2), recorded by b.
    record = b.call("outcome", ref="deploy-1", type="failure")
    assert [(e["entry_key"], e["version_read"], e["version_updated"]) for e in record["effects"]] == [
        ("team/checkout/retry", 1, 2)
    ]
    assert record["already_applied"] is False

    # a sees b's outcome and its effect on confidence.
    assert [r["outcome_ref"] for r in a.call("outcomes", entity_path="team")] == ["deploy-1"]
    current = a.call("read", entity_path="team/checkout", key="retry")
    assert current["confidence"] == pytest.approx(1.10)
    assert current["outcome_count"] == 1

    # The same ref from the other process is recognised as already applied.
    again = a.call("outcome", ref="deploy-1", type="failure", keys=["team/checkout/retry"])
    assert again["already_applied"] is True
    assert b.call("read", entity_path="team/checkout", key="retry")["confidence"] == pytest.approx(1.10)


def test_twenty_concurrent_writers_from_separate_processes(workers: Any) -> None:
    pool = workers(20)
    for index, worker in enumerate(pool):  # released together: every worker is already waiting on stdin
        worker.send("write", entity_path="race/one", key="counter", value={"writer": index})
    answers = [worker.receive() for worker in pool]
    assert all("ok" in answer for answer in answers), answers
    versions = sorted(answer["ok"]["version"] for answer in answers)
    assert versions == list(range(1, 21))

    history = pool[0].call("history", entity_path="race/one", key="counter")
    assert [h["version"] for h in history] == list(range(1, 21))
    assert sorted(h["value"]["writer"] for h in history) == list(range(20))
    by_writer = {answer["ok"]["value"]["writer"]: answer["ok"]["version"] for answer in answers}
    assert {h["value"]["writer"]: h["version"] for h in history} == by_writer


def test_concurrent_outcomes_across_processes(workers: Any) -> None:
    a, b = workers(2)
    rounds = 4
    for n in range(rounds):
        a.call("write", entity_path="race/outcomes", key=f"same-ref-{n}", value=n)
        a.call("write", entity_path="race/outcomes", key=f"two-refs-{n}", value=n)

    for n in range(rounds):
        # The same outcome_ref committed from both processes at once: applied exactly once.
        same_key = f"race/outcomes/same-ref-{n}"
        a.send("outcome", ref=f"incident-{n}", type="failure", keys=[same_key])
        b.send("outcome", ref=f"incident-{n}", type="failure", keys=[same_key])
        ra, rb = a.receive()["ok"], b.receive()["ok"]
        assert sorted([ra["already_applied"], rb["already_applied"]]) == [False, True]
        assert ra["effects"] == rb["effects"]
        entry = a.call("read", entity_path="race/outcomes", key=f"same-ref-{n}")
        assert entry["confidence"] == pytest.approx(1.10)
        assert entry["outcome_count"] == 1

        # Two different outcomes on one entry at once: both apply, neither update is lost.
        two_key = f"race/outcomes/two-refs-{n}"
        a.send("outcome", ref=f"a-{n}", type="failure", keys=[two_key])
        b.send("outcome", ref=f"b-{n}", type="minor_failure", keys=[two_key])
        ra, rb = a.receive()["ok"], b.receive()["ok"]
        assert not ra["already_applied"] and not rb["already_applied"]
        entry = b.call("read", entity_path="race/outcomes", key=f"two-refs-{n}")
        assert entry["confidence"] == pytest.approx(1.10 * 1.08)
        assert entry["outcome_count"] == 2
        befores = sorted([ra["effects"][0]["confidence_before"], rb["effects"][0]["confidence_before"]])
        assert befores[0] == pytest.approx(1.0)  # one saw the original, the other saw the first one's result
        assert befores[1] in (pytest.approx(1.10), pytest.approx(1.08))

    refs = [r["outcome_ref"] for r in a.call("outcomes", entity_path="race/outcomes")]
    assert sorted(refs) == sorted([f"incident-{n}" for n in range(rounds)] + [f"{p}-{n}" for p in "ab" for n in range(rounds)])
