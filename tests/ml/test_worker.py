"""The LM worker and amfs_answer: off unless configured, lazy, off the event loop, cached compiles, clear errors."""

from __future__ import annotations

import asyncio
import sys
import threading
import time

import pytest
import torch
from fastmcp import Client

from amfs_server.core.models import Actor
from amfs_server.core.service import WriteRequest
from amfs_server.server.app import create_app
from amfs_server.server.composition import build_service
from amfs_server.server.settings import load_settings
from amfs_server.ml.answer.worker import BackboneError, LMWorker
from amfs_server.core.errors import ValidationError

FACTS = [
    ("user/profile", "code_editor", "The user's code editor is Neovim."),
    ("user/profile", "dog_name", "The user's dog is named Biscuit."),
    ("user/profile", "project_database", "The user's project database is PostgreSQL."),
    ("team/infra", "cache", "The team's cache is Redis."),
]
ACTOR = Actor("test-agent", "test-session")


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
async def service(tmp_path):
    svc = build_service(load_settings({}, data_dir=tmp_path, embedder="none"))
    await svc.open()
    await svc.write_many(ACTOR, [WriteRequest(*fact) for fact in FACTS])
    yield svc
    await svc.close()


@pytest.fixture
def worker(tmp_path, monkeypatch):
    # An empty LM cache: tiny-random-qwen2 takes SmolLM2's tokenizer when a converted SmolLM2 is cached, and the
    # context tests below count this byte tokenizer's tokens.
    monkeypatch.setenv("AMFS_LM_CACHE_DIR", str(tmp_path / "lm-cache"))
    w = LMWorker("tiny-random-qwen2", device="cpu")
    yield w
    w.close()


async def test_worker_loads_lazily_and_reuses_compiled_memories(service, worker):
    assert not worker.loaded and worker.thread_id is None
    first = await worker.answer(service, ACTOR, "What is the user's dog named?", "prefix", "user/profile", 3)
    assert worker.loaded and first.load_ms > 0
    assert first.memories and all(e.entity_path == "user/profile" for e in first.memories)
    assert first.compiled_now == len(first.memories) and first.metrics.prefix_tokens > 0
    again = await worker.answer(service, ACTOR, "What is the user's dog named?", "hybrid", "user/profile", 3)
    assert again.load_ms == 0 and again.compiled_now == 0  # same entry versions: the compiled caches are reused
    assert again.metrics.input_tokens > first.metrics.input_tokens  # hybrid adds the top memory as text
    full = await worker.answer(service, ACTOR, "What is the user's dog named?", "full", "user/profile", 3)
    assert {e.key for e in full.memories} == {"code_editor", "dog_name", "project_database"}
    assert full.metrics.prefix_tokens == 0


async def test_with_no_memory_to_answer_from_nothing_is_asked_of_the_model(service, worker):
    """It answered anyway, inventing ("Billing is owned by a company called Billing"; red-team finding, 0.7.12)."""
    for mode in ("prefix", "text", "full"):
        with pytest.raises(ValidationError, match=r"No memory under entity_path 'nowhere' to answer from"):
            await worker.answer(service, ACTOR, "Who owns billing?", mode, "nowhere", 2)
    assert not worker.loaded


async def test_memories_that_do_not_fit_the_context_are_left_out_best_first_and_named(service, worker):
    # tiny-random-qwen2 reads 4,096 positions; two notes of about 1,700 tokens fit (with this tokenizer), as
    # text or compiled, a third does not. Until 0.7.12 such a call was refused, so one long memory written by anyone
    # made every question it ranked for fail (red-team finding): now the memories that fit are used, best first.
    long_notes = [WriteRequest("user/notes", f"n{i}", f"Note {i}: " + " ".join(f"w{i}x{j}" for j in range(250)))
                  for i in range(12)]
    await service.write_many(ACTOR, long_notes)
    for mode, fit in (("prefix", 2), ("text", 2), ("hybrid", 1)):  # hybrid reads its top memory twice
        compiled_before = len(worker.compiler) if worker.compiler is not None else 0
        answer = await worker.answer(service, ACTOR, "What do the notes say?", mode, "user/notes", 2, memories=12)
        retrieved = [hit.entry.key for hit in await service.retrieve(ACTOR, "What do the notes say?", limit=12,
                                                                     entity_path="user/notes", count_as_read=False)]
        assert [e.key for e in answer.memories] == retrieved[:fit], mode
        assert [e.key for e in answer.left_out] == retrieved[fit:], mode
        assert len(worker.compiler) - compiled_before <= fit  # nothing left out is compiled
    # Only what the model got counts as read (outcomes link to reads): the top note three times, the second twice
    # (prefix and text), the ten never given to the model not at all.
    counts = {e.key: e.recall_count for e in await service.list("user/notes", limit=20)}
    assert [counts[key] for key in retrieved] == [3, 2] + [0] * 10
    # A question that leaves no room for any memory is refused, naming the best one and what to change.
    long_question = "What do the notes say about " + " ".join(f"topic{j}" for j in range(200)) + "?"
    with pytest.raises(ValidationError, match=r"None of the 2 retrieved memories fits .*shorten the question"):
        await worker.answer(service, ACTOR, long_question, "text", "user/notes", 1000, memories=2)
    # The function the session benchmark calls in process refuses what does not fit (it ran past the context,
    # silently), hybrid's repeated top memory included (10,518 positions on an 8,192-position model; 0.7.12).
    from amfs_server.ml.answer.worker import MemoryText, answer_from_memories

    notes = [MemoryText(f"user/notes/n{i}@v1", request.value) for i, request in enumerate(long_notes)]
    with pytest.raises(ValidationError, match=r"reads at most 4096"):
        answer_from_memories(worker._backbone, worker.compiler, "What do the notes say?", "text", notes, 2)
    with pytest.raises(ValidationError, match=r"mode='hybrid' needs .* reads at most 4096"):
        answer_from_memories(worker._backbone, worker.compiler, "What do the notes say?", "hybrid", notes[:2], 2)
    answer_from_memories(worker._backbone, worker.compiler, "What do the notes say?", "prefix", notes[:2], 2)


async def test_answer_runs_in_one_worker_thread_while_the_event_loop_keeps_ticking(service, worker):
    await worker.load()
    loop_thread = threading.get_ident()
    ticked = threading.Event()
    forward_threads: set[int] = set()
    waits: list[bool] = []

    def pre_forward(module, args):
        forward_threads.add(threading.get_ident())
        # Each forward pass waits (bounded) for the loop to tick: on the loop it would wait in vain.
        waits.append(ticked.wait(timeout=10))

    handle = worker.backbone.model.register_forward_pre_hook(pre_forward)
    try:
        task = asyncio.ensure_future(worker.answer(service, ACTOR, "What is the user's code editor?", "prefix",
                                                   max_new_tokens=4))
        ticks = 0
        while not task.done():
            ticks += 1
            if ticks >= 3:
                ticked.set()
            await asyncio.sleep(0)
        result = await task
    finally:
        handle.remove()
    assert ticks >= 3 and waits and all(waits)
    assert forward_threads == {worker.thread_id} and loop_thread not in forward_threads
    assert result.metrics.new_tokens >= 1


async def test_a_cancelled_answer_stops_generating_and_frees_the_worker(service, worker):
    """A client that gives up (timeout, cancel) used to leave its generation running to max_new_tokens, and every
    key's answers queued behind it."""
    await worker.load()
    worker.backbone.stop_token_ids = ()  # random weights: make sure only max_new_tokens or a cancel ends it
    forwards: list[float] = []
    started = threading.Event()

    def count(module, args):
        forwards.append(time.perf_counter())
        if len(forwards) >= 3:
            started.set()

    handle = worker.backbone.model.register_forward_pre_hook(count)
    try:
        task = asyncio.ensure_future(worker.answer(service, ACTOR, "What is the user's code editor?", "text",
                                                   max_new_tokens=1024))
        while not started.is_set():
            await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        cancelled_at = len(forwards)
        following = await worker.answer(service, ACTOR, "What is the user's dog named?", "text", max_new_tokens=2)
    finally:
        handle.remove()
    assert following.metrics.new_tokens == 2
    # The cancelled call ran at most a couple more forward passes (the one in progress), not a thousand.
    assert len(forwards) - 2 <= cancelled_at + 2 < 1024


async def queued(worker: LMWorker, jobs: int) -> None:
    """Until `jobs` calls wait for the worker thread (the one running not counted)."""
    for _ in range(2000):
        if len(worker._waiting) >= jobs:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"{len(worker._waiting)} calls waiting, expected {jobs}")


async def test_waiting_answers_take_turns_by_caller(service, worker, monkeypatch):
    """First come, first served let one key's four long answers keep another key's question waiting behind all
    four (a red-team pass: 35.5 s behind one). Now the caller served least recently goes first."""
    import amfs_server.ml.answer.worker as worker_module

    order: list[str] = []
    release = threading.Event()
    real = worker_module.answer_from_memories

    def recorded(backbone, compiler, question, *args, **kwargs):
        question = question.split()[0]
        order.append(question)
        if question == "a1":  # the answer in progress while the others arrive
            assert release.wait(timeout=30)
        return real(backbone, compiler, question, *args, **kwargs)

    monkeypatch.setattr(worker_module, "answer_from_memories", recorded)
    await worker.load()
    greedy, other = Actor("greedy-key", "s1"), Actor("other-key", "s2")

    def ask(actor: Actor, question: str) -> asyncio.Future:
        return asyncio.ensure_future(  # (the words after the name find a memory: without one nothing is asked)
            worker.answer(service, actor, f"{question} dog named", "text", max_new_tokens=1))

    tasks = [ask(greedy, "a1")]
    while order != ["a1"]:
        await asyncio.sleep(0.005)
    tasks += [ask(greedy, "a2"), ask(greedy, "a3"), ask(greedy, "a4")]
    await queued(worker, 3)  # the greedy caller's calls are all waiting before the other's arrives
    tasks.append(ask(other, "b1"))
    await queued(worker, 4)
    release.set()
    results = await asyncio.gather(*tasks)
    # (the greedy caller's three reach the queue in whichever order their retrievals finish)
    assert order[:2] == ["a1", "b1"] and sorted(order[2:]) == ["a2", "a3", "a4"]
    # b1 waited for the answer in progress only, not for the three the greedy caller had waiting before it came.
    assert all(r.metrics.new_tokens == 1 for r in results)


async def test_a_waiting_answer_given_up_never_runs_and_close_cancels_those_still_waiting(worker):
    ran: list[str] = []
    release = threading.Event()

    def job(name: str) -> str:
        ran.append(name)
        if name == "first":
            assert release.wait(timeout=30)
        return name

    first = asyncio.ensure_future(worker._run("a", job, "first"))
    while ran != ["first"]:
        await asyncio.sleep(0.005)
    given_up = asyncio.ensure_future(worker._run("b", job, "given-up"))
    kept = asyncio.ensure_future(worker._run("c", job, "kept"))
    await queued(worker, 2)
    given_up.cancel()
    await asyncio.sleep(0.02)  # the loop passes the cancel on to the waiting job
    release.set()
    assert await first == "first" and await kept == "kept"
    with pytest.raises(asyncio.CancelledError):
        await given_up
    assert ran == ["first", "kept"]

    release.clear()
    blocking = asyncio.ensure_future(worker._run("a", job, "first"))
    while ran[-1] != "first":
        await asyncio.sleep(0.005)
    waiting = asyncio.ensure_future(worker._run("b", job, "never"))
    await queued(worker, 1)
    closing = asyncio.ensure_future(asyncio.to_thread(worker.close))  # waits for the job in progress
    await asyncio.sleep(0.02)
    release.set()
    await closing
    assert await blocking == "first"
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(waiting, timeout=5)  # cancelled, not left waiting for good
    assert "never" not in ran


def test_the_fair_queue_serves_the_caller_served_least_recently_and_each_callers_jobs_in_order():
    from amfs_server.ml.answer.worker import FairQueue

    queue = FairQueue()
    for caller, job in [("a", 1), ("a", 2), ("a", 3), ("b", 1), ("c", 1), ("b", 2)]:
        queue.put(caller, (caller, job))  # type: ignore[arg-type]
    assert [queue.take() for _ in range(3)] == [("a", 1), ("b", 1), ("c", 1)]
    queue.put("d", ("d", 1))  # type: ignore[arg-type]  # never served: before a, b and c's second turns
    queue.put("c", ("c", 2))  # type: ignore[arg-type]  # c was served last: after a and b
    taken = [queue.take() for _ in range(len(queue))]
    assert taken == [("d", 1), ("a", 2), ("b", 2), ("c", 2), ("a", 3)]
    queue.put("z", ("z", 1))  # type: ignore[arg-type]
    assert queue.drain() == [("z", 1)] and len(queue) == 0
    assert queue.take() is None  # a slot left over from a drained queue finds nothing to run


async def test_unknown_backbone_is_a_domain_error_naming_the_fix(service, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    worker = LMWorker("amfs-test/no-such-model", device="cpu")
    try:
        with pytest.raises(BackboneError, match="nothing is downloaded"):
            await worker.answer(service, ACTOR, "What is the user's dog named?")
        assert not worker.loaded
    finally:
        worker.close()


async def test_a_backbone_without_torch_installed_is_a_domain_error_with_the_install_command(service, monkeypatch):
    monkeypatch.delitem(sys.modules, "amfs_server.ml.answer.backbone", raising=False)
    monkeypatch.setitem(sys.modules, "torch", None)  # what `import torch` meets without the [lm] extra
    worker = LMWorker("smollm2", device="cpu")
    try:
        with pytest.raises(BackboneError, match=r"needs torch and transformers.*pip install .\.\[lm\]. \(in the amfs-server checkout\)"):
            await worker.answer(service, ACTOR, "What is the user's dog named?")
        assert not worker.loaded
    finally:
        worker.close()


async def test_amfs_answer_is_off_unless_a_backbone_is_configured(tmp_path):
    settings = load_settings({}, data_dir=tmp_path, embedder="none")
    async with Client(create_app(build_service(settings), settings)) as client:
        assert "amfs_answer" not in {tool.name for tool in await client.list_tools()}


async def test_amfs_answer_returns_the_answer_with_the_modes_metrics(tmp_path):
    settings = load_settings({}, data_dir=tmp_path, embedder="none", lm_backbone="tiny-random-qwen2")
    async with Client(create_app(build_service(settings), settings)) as client:
        tools = {tool.name: tool for tool in await client.list_tools()}
        assert tools["amfs_answer"].annotations.read_only_hint is True
        for entity_path, key, value in FACTS:
            await client.call_tool("amfs_write", {"entity_path": entity_path, "key": key, "value": value})
        result = await client.call_tool("amfs_answer", {"query": "What is the user's project database?",
                                                        "entity_path": "user/profile", "max_new_tokens": 3})
        answer = result.structured_content
        assert answer["mode"] == "prefix" and answer["backbone"].startswith("tiny-random-qwen2")
        assert isinstance(answer["answer"], str)
        assert answer["memories"][0]["rank"] == 1 and answer["memories"][0]["entry_key"].startswith("user/profile/")
        metrics = answer["metrics"]
        assert metrics["prefix_tokens"] > 0 and metrics["input_tokens"] > 0 and metrics["load_ms"] > 0
        assert {"retrieve_ms", "compile_ms", "ttft_ms", "generate_ms", "new_tokens"} <= set(metrics)
        text = (await client.call_tool("amfs_answer", {"query": "What is the user's project database?",
                                                       "mode": "text", "max_new_tokens": 2})).structured_content
        assert text["metrics"]["prefix_tokens"] == 0 and text["metrics"]["load_ms"] == 0


async def test_amfs_answer_gives_the_model_as_many_memories_as_asked_and_refuses_a_bad_count(tmp_path):
    settings = load_settings({}, data_dir=tmp_path, embedder="none", lm_backbone="tiny-random-qwen2")
    async with Client(create_app(build_service(settings), settings)) as client:
        for entity_path, key, value in FACTS:
            await client.call_tool("amfs_write", {"entity_path": entity_path, "key": key, "value": value})
        question = {"query": "What is the user's project database, editor and dog?", "entity_path": "user/profile",
                    "max_new_tokens": 2}
        one = (await client.call_tool("amfs_answer", {**question, "mode": "text", "memories": 1})).structured_content
        three = (await client.call_tool("amfs_answer", {**question, "mode": "text", "memories": 3})).structured_content
        assert len(one["memories"]) == 1 and len(three["memories"]) == 3
        assert one["memories"][0] == three["memories"][0]  # the same retrieval, cut at the count
        assert one["metrics"]["input_tokens"] < three["metrics"]["input_tokens"]
        assert "left_out" not in three  # listed only when a memory was left out
        # A pasted log (about 5,300 tokens with this tokenizer, past the 4,096 positions) that ranks first no
        # longer makes the question fail: the model gets the memories that fit, and the reply names the one it did not.
        await client.call_tool("amfs_write", {"entity_path": "user/profile", "key": "log",
                                              "value": "project database editor dog " * 1200})
        fits = (await client.call_tool("amfs_answer", {**question, "mode": "text", "memories": 3})).structured_content
        assert fits["left_out"] == [{"entry_key": "user/profile/log", "version": 1}]
        assert len(fits["memories"]) == 2 and "user/profile/log" not in {m["entry_key"] for m in fits["memories"]}
        for bad in (0, 51, "three"):
            refused = await client.call_tool("amfs_answer", {**question, "memories": bad}, raise_on_error=False)
            assert refused.is_error and "memories" in refused.content[0].text


async def test_amfs_answer_with_an_unknown_backbone_is_a_tool_error_with_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    settings = load_settings({}, data_dir=tmp_path, embedder="none", lm_backbone="amfs-test/no-such-model")
    async with Client(create_app(build_service(settings), settings)) as client:
        await client.call_tool("amfs_write", {"entity_path": "svc", "key": "k", "value": "anything at all"})
        result = await client.call_tool("amfs_answer", {"query": "anything?"}, raise_on_error=False)
    assert result.is_error
    assert "nothing is downloaded" in result.content[0].text and "--lm-backbone smollm2" in result.content[0].text


async def test_the_backbone_loads_only_after_the_services_embedder_has_loaded(service, worker, monkeypatch):
    # Two transformers models loading at once in two threads can leave one on the meta device; the server
    # warms its embedder up in a thread at start, so the worker waits for that load before its own.
    from amfs_server.ml.answer import backbone as backbone_mod

    order: list[str] = []
    embedder_loaded = threading.Event()

    class SlowLoadingEmbedder:
        def load(self):
            embedder_loaded.wait(timeout=10)  # as if a warm-up were still loading it
            order.append("embedder")

    real_load = backbone_mod.load_backbone

    def recording_load(*args, **kwargs):
        order.append("backbone")
        return real_load(*args, **kwargs)

    monkeypatch.setattr(service, "embedder", SlowLoadingEmbedder())
    monkeypatch.setattr(backbone_mod, "load_backbone", recording_load)
    task = asyncio.ensure_future(worker.answer(service, ACTOR, "What is the user's dog named?", "full",
                                               "user/profile", 2))
    for _ in range(5):
        await asyncio.sleep(0)
    assert order == [] and not task.done()
    embedder_loaded.set()
    await task
    assert order == ["embedder", "backbone"]
    again = await worker.answer(service, ACTOR, "What is the user's dog named?", "full", "user/profile", 2)
    assert again.load_ms == 0 and order == ["embedder", "backbone"]  # loaded once; no second wait
