"""The Python SDK as the documents use it: AgentMemory (sync) and AsyncAgentMemory."""

from __future__ import annotations

import asyncio

import pytest

from amfs_server import AgentMemory, AsyncAgentMemory, MemoryType, OutcomeType


def test_sync_sdk_walks_through_the_documented_feedback_loop(tmp_path) -> None:
    with AgentMemory(agent_id="my-agent", data_dir=tmp_path, embedder="none") as mem:
        entry = mem.write("svc", "pattern", "use connection pooling", confidence=0.85)
        assert entry.confidence == 0.85
        mem.read("svc", "pattern")
        (updated,) = mem.commit_outcome("INC-1042", OutcomeType.CRITICAL_FAILURE, ["svc/pattern"])
        assert round(updated.confidence, 4) == 0.9775
        assert mem.read("svc", "missing") is None
        assert [e.key for e in mem.search(memory_type=MemoryType.FACT)] == ["pattern"]
        assert [e.version for e in mem.history("svc", "pattern")] == [1]
        assert [e.key for e in mem.list("svc")] == ["pattern"]


def test_sync_sdk_works_inside_a_running_event_loop(tmp_path) -> None:
    async def inside_loop() -> str:
        with AgentMemory(agent_id="nb", data_dir=tmp_path, embedder="none") as mem:
            mem.write("svc", "k", "v")
            return mem.read("svc", "k").value

    assert asyncio.run(inside_loop()) == "v"


async def test_async_sdk_auto_causal_linking_across_reads(tmp_path) -> None:
    async with AsyncAgentMemory(agent_id="agent/a", data_dir=tmp_path, embedder="none") as mem:
        for key in ("retry-pattern", "timeout-config", "pool-settings"):
            await mem.write("svc", key, "v")
            await mem.read("svc", key)
        updated = await mem.commit_outcome("DEP-300", OutcomeType.SUCCESS)
        assert sorted(e.key for e in updated) == ["pool-settings", "retry-pattern", "timeout-config"]
        assert all(e.confidence == pytest.approx(0.97) for e in updated)


def test_two_sdk_instances_share_the_store_but_not_the_session(tmp_path) -> None:
    with AgentMemory(agent_id="a", data_dir=tmp_path, embedder="none") as first, \
            AgentMemory(agent_id="b", data_dir=tmp_path, embedder="none") as second:
        first.write("svc", "k", "from a")
        assert second.read("svc", "k").value == "from a"
        assert first.session_id != second.session_id


def test_decay_half_life_is_taken_from_the_constructor(tmp_path) -> None:
    with AgentMemory(agent_id="a", data_dir=tmp_path, decay_half_life_days=30.0, embedder="none") as mem:
        assert mem.service.config.decay_half_life_days == 30.0


def test_misuse_gets_a_clear_error_and_changes_nothing(tmp_path) -> None:
    from amfs_server.core.errors import AmfsError, ValidationError

    with AgentMemory(agent_id="a", data_dir=tmp_path / "store", embedder="none") as mem:
        mem.write("svc", "k", "v")
        assert [e.key for e in mem.search(since="2020-01-01")] == ["k"]  # a date string, as event_after takes
        with pytest.raises(ValidationError, match="since must be an ISO 8601"):
            mem.search(since="yesterday")
        assert [e.key for e in mem.write_many([{"entity_path": "svc", "key": "d", "value": 1}])] == ["d"]
        with pytest.raises(ValidationError, match="write_many request 1"):
            mem.write_many([{"entity_path": "svc", "key": "e", "value": 1}, {"entity_path": "svc", "key": "f"}])
        with pytest.raises(ValidationError, match="is a str"):
            mem.write_many(["svc/g"])  # type: ignore[list-item]
        assert [e.key for e in mem.list("svc")] == ["d", "k"]
    with pytest.raises(AmfsError, match="closed"):  # used to wait forever on the stopped loop
        mem.read("svc", "k")
    a_file = tmp_path / "not-a-folder"
    a_file.write_text("x")
    with AgentMemory(data_dir=a_file, embedder="none") as misplaced:
        with pytest.raises(AmfsError, match="is a file, not a folder"):
            misplaced.write("svc", "k", "v")


def test_the_seeds_rrf_is_a_named_configuration_for_the_server_and_a_call(tmp_path, monkeypatch) -> None:
    from amfs_server import WriteRequest
    from amfs_server.core.errors import ValidationError
    from amfs_server.server.settings import load_settings

    assert load_settings({}).fusion == "hybrid" and load_settings({"AMFS_FUSION": "rrf"}).fusion == "rrf"
    with pytest.raises(ValidationError, match="AMFS_FUSION"):
        load_settings({"AMFS_FUSION": "borda"})
    monkeypatch.setenv("AMFS_FUSION", "rrf")
    with AgentMemory(agent_id="a", data_dir=tmp_path, embedder="none") as mem:
        assert mem.service.config.fusion == "rrf"
        mem.write_many([WriteRequest("svc", "retry", "retry failed charges with backoff"),
                        WriteRequest("svc", "pool", "pool size is 50 connections")])
        (configured,) = mem.retrieve("retry charges", explain=True)
        (hybrid,) = mem.retrieve("retry charges", explain=True, fusion="hybrid", weights={"speaker": 0.1})
        assert configured.entry.key == hybrid.entry.key == "retry"
        # RRF scores are weight / (60 + rank); the hybrid fusion's keyword share is a 0..1 score times its weight
        assert configured.score == pytest.approx(0.2 / 61 + 0.2 / 61 + 0.2 / 61)
        assert hybrid.score != configured.score
        with pytest.raises(ValidationError, match="Unknown fusion"):
            mem.retrieve("retry", fusion="borda")


def test_closing_while_other_threads_are_mid_call_lets_those_calls_finish_and_refuses_later_ones(tmp_path) -> None:
    """`close` stopped the loop under calls other threads had in flight, which then waited forever (red-team finding,
    0.7.15: 5 of 5 runs left callers blocked)."""
    import threading

    from amfs_server.core.errors import AmfsError

    mem = AgentMemory(agent_id="a", data_dir=tmp_path, embedder="none")
    mem.write("svc", "k0", "v")
    started, outcomes = threading.Barrier(5), []

    def worker(n: int) -> None:
        started.wait()
        for i in range(50):
            try:
                mem.write("svc", f"k{n}-{i}", "v")
            except AmfsError as error:
                outcomes.append(str(error))
                return
        outcomes.append("finished")

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    started.wait()
    mem.close()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(thread.is_alive() for thread in threads)
    assert len(outcomes) == 4
    assert all(o == "finished" or o.startswith("This AgentMemory is closed") for o in outcomes), outcomes
    with pytest.raises(AmfsError, match="closed"):
        mem.read("svc", "k0")
    with AgentMemory(agent_id="a", data_dir=tmp_path, embedder="none") as again:  # every acknowledged write is there
        assert again.read("svc", "k0").value == "v"


async def test_a_closed_async_sdk_refuses_calls_instead_of_reopening_its_store(tmp_path) -> None:
    from amfs_server.core.errors import AmfsError

    mem = AsyncAgentMemory(agent_id="a", data_dir=tmp_path, embedder="none")
    await mem.write("svc", "k", "v")
    await mem.close()
    with pytest.raises(AmfsError, match="This AsyncAgentMemory is closed"):
        await mem.write("svc", "k2", "v")
    assert mem._opened is False
    await mem.close()  # a second close does nothing
