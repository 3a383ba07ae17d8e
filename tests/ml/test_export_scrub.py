"""What a forget, TTL expiry or clear leaves in the training exports under the export folder: nothing made from
what was erased, whichever front end erased it and whenever (red-team repros of 0.3.2's first export scrub)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from amfs_server import AgentMemory
from amfs_server.core.errors import NotFoundError, StoreError
from amfs_server.core.interprocess import acquire_exclusive
from amfs_server.ml import MLService
from amfs_server.ml.export import ExportResult, scrub_exports
from amfs_server.server.composition import build_service, build_services
from amfs_server.server.settings import load_settings


def export(folder: Path, name: str, examples: list[tuple[str, list[list]]]) -> Path:
    """An export as the exporter writes it: the examples, and beside them, line for line, what each was made from."""
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"messages": [text]}) + "\n" for text, _ in examples))
    path.with_name(path.name + ".amfs-sources").write_text("".join(json.dumps(s) + "\n" for _, s in examples))
    return path


def texts(path: Path) -> list[str]:
    return [json.loads(line)["messages"][0] for line in path.read_text().splitlines()]


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    with AgentMemory(agent_id="agent/test", data_dir=tmp_path / "data", embedder="none") as mem:
        mem.write("svc", "secret", "SECRET value")
        mem.write("svc", "kept", "kept value")
    return tmp_path / "data"


def exports_of(data_dir: Path) -> Path:
    return data_dir / "ml" / "exports"


def two_examples(folder: Path, name: str) -> Path:
    return export(folder, name, [("SECRET example", [["svc/secret", 1], ["svc/kept", 1]]),
                                 ("kept example", [["svc/kept", 1]])])


def test_the_sdk_forget_scrubs_exports_of_any_name(data_dir: Path) -> None:
    """The SDK's forget left the memory in the exports (it had no ML service), and an export named other than
    *.jsonl (train.json, data/train) was never scrubbed."""
    names = ["sft.jsonl", "train.json", "sub/data", "UPPER.JSONL"]
    paths = [two_examples(exports_of(data_dir), name) for name in names]
    with AgentMemory(agent_id="agent/test", data_dir=data_dir, embedder="none") as mem:
        assert mem.forget("svc", "secret") == 1
    for path in paths:
        assert texts(path) == ["kept example"], path
        assert path.with_name(path.name + ".amfs-sources").read_text() == '[["svc/kept", 1]]\n'


def test_opening_the_store_scrubs_what_another_process_erased_or_a_stopped_scrub_left(data_dir: Path) -> None:
    """kill -9 between a forget's delete and its scrub, a TTL expiry erased by `memory show` or by a server with
    another data dir (PostgreSQL): the next open of a store catches the exports up."""
    path = two_examples(exports_of(data_dir), "rm.jsonl")
    with sqlite3.connect(data_dir / "amfs.db") as conn:  # erased behind every front end's back
        conn.execute("DELETE FROM entries WHERE key = 'secret'")
    with AgentMemory(agent_id="agent/test", data_dir=data_dir, embedder="none") as mem:
        assert mem.read("svc", "kept") is not None
    assert texts(path) == ["kept example"]


def test_a_forget_that_finds_nothing_still_scrubs(data_dir: Path) -> None:
    """A retry after a forget whose reply was lost with the connection finds nothing, yet the first delete had
    committed: the retry's scrub catches the exports up."""
    with AgentMemory(agent_id="agent/test", data_dir=data_dir, embedder="none") as mem:
        path = two_examples(exports_of(data_dir), "rm.jsonl")  # after the open, which would have scrubbed it
        with sqlite3.connect(data_dir / "amfs.db") as conn:  # the first attempt's delete, its reply lost
            conn.execute("DELETE FROM entries WHERE key = 'secret'")
        with pytest.raises(NotFoundError):
            mem.forget("svc", "secret")
    assert texts(path) == ["kept example"]


async def test_the_scrub_never_follows_a_link_planted_at_its_temporary_name(data_dir: Path, tmp_path: Path) -> None:
    """The scrub opened `.<export>.<pid>.scrub` with a plain open(): a link planted there made it overwrite a file
    outside the folder."""
    path = two_examples(exports_of(data_dir), "rw.jsonl")
    victim = tmp_path / "victim.txt"
    victim.write_text("untouched")
    for name in (f".rw.jsonl.{os.getpid()}.scrub", f".rw.jsonl.amfs-sources.{os.getpid()}.scrub"):
        (path.parent / name).symlink_to(victim)
    service = build_service(load_settings({}, data_dir=data_dir, embedder="none"))
    await service.open()
    try:
        await service.forget("svc", "secret")
    finally:
        await service.close()
    assert victim.read_text() == "untouched"
    assert texts(path) == ["kept example"] and not path.is_symlink()


async def test_an_export_finished_after_a_forget_scrubbed_is_scrubbed_when_it_lands(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An export that read a memory before a forget committed, and finished after the forget's scrub, kept 97 of
    its examples: MLService.export_training_data scrubs once more after writing."""
    service = build_service(load_settings({}, data_dir=data_dir, embedder="none"))
    await service.open()
    ml = MLService(service, exports_of(data_dir))

    async def slow_export(*args, **kwargs) -> ExportResult:  # it read the store before this forget...
        await service.forget("svc", "secret")  # ...which commits and scrubs while the export is being written
        path = two_examples(exports_of(data_dir), "late.jsonl")
        return ExportResult("sft", 2, [], "2026-11-24T00:00:00Z", str(path))

    monkeypatch.setattr(ml.exporter, "write_jsonl", slow_export)
    try:
        await ml.export_training_data("sft", output_path="late.jsonl")
    finally:
        await service.close()
    assert texts(exports_of(data_dir) / "late.jsonl") == ["kept example"]


@pytest.mark.parametrize("erase", ["forget", "ttl"])
async def test_a_key_erased_and_written_again_does_not_keep_the_old_versions_examples(
    data_dir: Path, erase: str
) -> None:
    """A key forgotten (or expired) and written again starts over at version 1: by key and version alone the scrub
    took the new v1 for the erased one and kept its examples for good (red-team repro, on both stores)."""
    from amfs_server.core.models import Actor
    from amfs_server.core.service import WriteRequest

    now = [datetime.now(timezone.utc)]
    services = build_services(load_settings({}, data_dir=data_dir, embedder="none"), ml=True, clock=lambda: now[0])
    service, ml = services.memory, services.ml
    await service.open()
    actor = Actor("agent/x", "s1")
    try:
        await service.write(actor, WriteRequest("svc", "k", "SECRETX9 the root password is tulip",
                                                ttl_seconds=3600 if erase == "ttl" else None))
        await service.read(actor, "svc", "k")
        await service.commit_outcome(actor, "INC-1", "failure")
        await ml.export_training_data("reward_model", output_path="train.jsonl")
        path = exports_of(data_dir) / "train.jsonl"
        assert "SECRETX9" in path.read_text()
        written = json.loads(path.with_name("train.jsonl.amfs-sources").read_text().splitlines()[0])
        assert [source[:2] for source in written] == [["svc/k", 1]]
        assert len(written[0]) == 3  # the source names its version's write time
        if erase == "forget":  # by another server, with another data dir: no scrub of these exports follows it
            assert await service.store.forget("svc", "k") == 1
            now[0] += timedelta(minutes=1)
        else:
            now[0] += timedelta(hours=2)
        await service.write(actor, WriteRequest("svc", "k", "harmless new value"))  # version 1 again
        await scrub_exports(service, exports_of(data_dir))  # the sweep's (and every open's) scrub
    finally:
        await service.close()
    assert "SECRETX9" not in path.read_text()


HOLDER = """
import fcntl, sys, time
with open(sys.argv[1], "a+b") as handle:
    fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
    print("locked", flush=True)
    time.sleep(float(sys.argv[2]))
"""


def test_a_lock_held_by_a_stopped_process_is_an_error_naming_it_not_a_silent_wait(tmp_path: Path) -> None:
    """A process stopped with Ctrl-Z while it held amfs.vectors.lock left every forget and search waiting forever,
    without a word; a lock file that is a directory was a traceback."""
    lock = tmp_path / "amfs.vectors.lock"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(lock), "5"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        started = time.monotonic()
        with pytest.raises(StoreError, match=r"Another process has held .*amfs.vectors.lock for 1 s \(the index\)"):
            acquire_exclusive(lock, "the index", timeout_s=1.0)
        assert time.monotonic() - started < 4
    finally:
        holder.kill()
        holder.wait()
    handle = acquire_exclusive(lock, "the index", timeout_s=1.0)  # free again
    assert handle is not None
    handle.close()
    folder = tmp_path / "a-directory.lock"
    folder.mkdir()
    with pytest.raises(StoreError, match=r"Cannot open the lock file .*a-directory.lock .*plain file"):
        acquire_exclusive(folder, "the index")
