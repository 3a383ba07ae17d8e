"""The session benchmark: does the prefix channel answer as well as text, and what does it cost?

A session writes facts as memories (one write per fact, over a temporary SQLite store, MiniLM
embeddings), then asks targeted-recall questions. A hit (the strict rule, the default) is the expected
keyword in the answer as a whole word, case-insensitive, with none of the question's distractor answers
(the same attribute of the other people or services: an answer naming both has not chosen); the
report's original rule (the keyword as a substring) is reported beside it as *lenient*. Modes:

=================  ==================================================================================
D_full_history     every fact in the prompt, as text, in the order written
B_flat_cos         plain cosine over MiniLM embeddings of the facts; the top-k as text
B_ams_text         this product's ``retrieve()`` (semantic + keyword + recency + confidence, RRF); top-k as text
B_text_top1        the same retrieval, only its top memory as text (the text baseline at the memories a
                   prefix that trusts the top-1 effectively reads)
A_ams_prefix       the same retrieved memories as compiled key/value caches; the prompt holds only the question
C_ams_hybrid       the compiled caches plus the top-1 memory as text
X@ks1.0            a prefix mode at another key scale (``--key-scales-beside``, default 1.0 = plain
                   concatenation), printed beside the default
O_gold_text        reference, not a mode: only the gold fact, as text (the reader's ceiling under perfect
                   retrieval)
=================  ==================================================================================

A and C are compared with the best text mode run, not only with B_ams_text. A prefix that reads the
same tokens as B_ams_text can differ from it only in its cache: memories after the first never attended
to the earlier ones, and their keys are scaled by the key scale, a bet that the retriever's top-1 is right.

Sessions: the report's fixed N=10/N=20 set, ``--session-file FILE`` (an external session; format in
``session_data.parse_session`` and ``data/example_session.json``), or ``--large`` generated sessions, whose
seeds are split: ``--split tuning`` (seeds 100-199) is where knobs are chosen, ``--split report`` (0-99,
the default) is what a report states; each refuses the other's seeds.

Every mode generates through ``worker.answer_from_memories`` (the ``amfs_answer`` tool's code), one
greedy loop for all, so times compare. Queries run mode after mode for each question (interleaved), so
a machine that gets busier mid-run slows every mode alike. In process, memories are compiled when
written (a write-time cost, reported apart) and a query's ``compile_ms`` is the cache lookup. What the
prefix channel saves in time as memories grow is ``prefix_cost``'s subject.

Nothing measured is lost to one answer that cannot run. Full history reads every fact and the reference the gold
fact, so whether their prompts fit the model's context is known before anything runs: the run stops then, naming
every question and mode. A retrieval mode learns what it reads only when it retrieves: as in ``amfs_answer``,
memories that do not fit beside those before them are left out, best first (``left_out``), and an answer with
none that fits (or any refused ``amfs_answer`` call) is refused: listed in the report (``refused``), counted in no
rate, and the run goes on.

``--via-server`` runs the same session through the server instead: the facts are written with the
``amfs_write`` tool and D/B_ams_text/A/C answered by ``amfs_answer`` (mode
full/text/prefix/hybrid) of an app from ``server.app.create_app`` with the backbone
configured, over an in-memory MCP client; metrics are the tool's. The server compiles memories on first
use. B_flat_cos and the oracle have no server equivalent and run in process beside it; the report says
which path served each mode. B_text_top1 and other key scales are not run through the server
(``amfs_answer`` takes no memory count, and the server has one key scale).

    amfs-server bench session --backbone smollm2 --n-facts 20
    amfs-server bench session --backbone smollm2 --session-file session_bench/data/example_session.json
    amfs-server bench session --backbone smollm2 --large --split tuning --seeds 100,101,102
    amfs-server bench session --backbone smollm2 --large --seeds 3,4,5
    python -m amfs_server.session_bench.session_bench --backbone tiny-random-qwen2 --max-new-tokens 4

Writes ``report.json``, ``report.md`` and ``report.png`` to ``--out`` (default
``reports/session/<backbone>-n<N>/``, ``-large`` (``-large-tuning``) for the generated sessions,
``-file-<name>`` for a session file, ``-server`` appended with ``--via-server``); progress goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import platform
import re
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ..core.embedding import DEFAULT_EMBEDDER
from ..core.errors import ValidationError
from ..core.ports import Embedder
from . import pyplot
from .served import ServedApp, ToolRefused
from .session_data import (REPORTING_SEEDS, TUNING_SEEDS, Fact, Session, SessionFileError, check_seeds,
                           generated_session, load_session_file, most_generated_facts, report_session)
from ..ml.answer.worker import (MAX_FULL_ENTRIES, MAX_MEMORIES, AnswerMode, MemoryText, answer_from_memories,
                                fitting_memories, memory_text, prompt_tokens_past_the_context)

# A mode name is a base mode, or a prefix mode at another key scale: "A_ams_prefix@ks1.0".
ModeName = str
MODES: tuple[ModeName, ...] = ("D_full_history", "B_flat_cos", "B_ams_text", "B_text_top1", "A_ams_prefix",
                               "C_ams_hybrid")
# The reader's ceiling under perfect retrieval: only the gold fact, as text. A reference reported beside the five
# modes (each is also scored on the questions the reference answers, and beyond them), never one of them: no
# system can know the gold fact.
ORACLE: ModeName = "O_gold_text"
ALL_MODES: tuple[ModeName, ...] = (*MODES, ORACLE)
# How each benchmark mode is served: which generation mode, and where its memories come from.
GENERATION_MODE: dict[ModeName, AnswerMode] = {
    "D_full_history": "full", "B_flat_cos": "text", "B_ams_text": "text", "B_text_top1": "text",
    "A_ams_prefix": "prefix", "C_ams_hybrid": "hybrid", "O_gold_text": "text",
}
RETRIEVAL: dict[ModeName, str] = {
    "D_full_history": "none", "B_flat_cos": "flat_cos", "B_ams_text": "ams", "B_text_top1": "ams",
    "A_ams_prefix": "ams", "C_ams_hybrid": "ams", "O_gold_text": "gold",
}
# B_text_top1: the same retrieval, only its top memory as text. The fair text baseline for a prefix channel
# that trusts the top-1 (key scale < 1): as many memories as it effectively reads.
GIVEN: dict[ModeName, int] = {"B_text_top1": 1}
# The text modes A is compared against: the report states A minus the best of them, not only B_ams_text.
TEXT_MODES: tuple[ModeName, ...] = ("D_full_history", "B_flat_cos", "B_ams_text", "B_text_top1")
PREFIX_MODES: tuple[ModeName, ...] = ("A_ams_prefix", "C_ams_hybrid")
# The key scale printed beside the default (1.0 = plain concatenation, no bet on the top-1).
DEFAULT_KEY_SCALES_BESIDE = "1.0"
# --via-server: the modes amfs_answer serves (D as mode="full", the others with the server's retrieval and
# `memories` = top-k, or 1 for B_text_top1); B_flat_cos and the oracle have no server equivalent and run in
# process beside it.
SERVER_MODES: frozenset[ModeName] = frozenset({"D_full_history", "B_ams_text", "B_text_top1", "A_ams_prefix",
                                               "C_ams_hybrid"})
ServedBy = Literal["in-process", "server"]
DEFAULT_TOP_K = 3
DEFAULT_MAX_NEW_TOKENS = 30  # the report's mt=30
LARGE_FACTS = 60
LARGE_PEOPLE = 6
# Targets this benchmark is judged by (the bar): A's prefilled tokens vs D's, A/C time vs B_ams_text's.
TARGET_INPUT_TOKEN_RATIO = 0.15
TARGET_GENERATE_RATIO = 1.10
BOOTSTRAP_RESAMPLES = 2000


def base_mode(mode: ModeName) -> ModeName:
    """``A_ams_prefix@ks1.0`` -> ``A_ams_prefix``."""
    return mode.split("@", 1)[0]


def mode_key_scale(mode: ModeName) -> float | None:
    """The key scale a variant mode names (``@ks1.0``), None for the compiler's default."""
    return float(mode.split("@ks", 1)[1]) if "@ks" in mode else None


def _is_variant(mode: str) -> bool:
    base, _, scale = mode.partition("@ks")
    try:
        return base in PREFIX_MODES and 0 < float(scale) <= 4
    except ValueError:
        return False


def variant(mode: ModeName, key_scale: float) -> ModeName:
    return f"{mode}@ks{float(key_scale)}"


# ---------------------------------------------------------------------------
# Statistics
# ---------------------------------------------------------------------------

def wilson_interval(hits: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """95% Wilson score interval for a proportion (sound at 0/n and n/n, unlike the normal interval)."""
    if n == 0:
        return (0.0, 1.0)
    p = hits / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def bootstrap_mean_interval(values: Sequence[float], seed: int = 0) -> tuple[float, float]:
    """95% percentile-bootstrap interval of the mean (timings are skewed, so no normality is assumed)."""
    data = np.asarray(values, dtype=float)
    if data.size == 0:
        return (float("nan"), float("nan"))
    if data.size == 1:
        return (float(data[0]), float(data[0]))
    rng = np.random.default_rng(seed)
    means = data[rng.integers(0, data.size, size=(BOOTSTRAP_RESAMPLES, data.size))].mean(axis=1)
    return (float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5)))


# ---------------------------------------------------------------------------
# One session
# ---------------------------------------------------------------------------

@dataclass
class QueryResult:
    mode: ModeName
    session: str
    question: str
    expected: str
    answer: str
    hit: bool  # the strict rule: the expected keyword as a whole word and none of the query's distractors
    gold_retrieved: bool | None  # the answering fact among the memories given (None for D and the oracle)
    gold_rank: int | None  # its place among them, 1 = first (None where not given, or for D and the oracle)
    memories: list[str]
    input_tokens: int
    prefix_tokens: int
    new_tokens: int
    retrieve_ms: float
    compile_ms: float
    ttft_ms: float
    generate_ms: float
    total_ms: float = 0.0  # the whole answer as the caller sees it: retrieval, compile, generation (+ MCP call)
    served_by: ServedBy = "in-process"
    hit_lenient: bool = False  # the report's original rule: the keyword as a substring
    distractors: list[str] = field(default_factory=list)
    # Retrieved but not given: too long for the model's context beside those before it (amfs_answer's `left_out`).
    left_out: list[str] = field(default_factory=list)


@dataclass
class RefusedAnswer:
    """A question one mode could not answer (its prompt past the model's context, a refused tool call): kept out
    of every rate and listed in the report, so the rest of the run stands."""

    session: str
    query_index: int  # its place in the session's queries, from 0, as a session file counts them
    question: str
    mode: ModeName
    reason: str
    served_by: ServedBy = "in-process"


class _Refused(Exception):
    """One answer refused; the run records it and goes on."""


# How amfs_answer words its refusals of what does not fit the model's context (ml/answer/worker.py).
_CONTEXT_REFUSAL = re.compile(r"prompt tokens and up to \d+ new ones|fits \S+ context beside")


@dataclass
class SessionRun:
    session: str
    n_facts: int
    n_queries: int
    write_ms: float
    compile_ms_total: float
    memories_compiled: int
    served_by: str = "in-process"
    backbone_load_ms: float = 0.0  # --via-server: the server worker's load, on its first (warm-up) call
    results: list[QueryResult] = field(default_factory=list)
    refused: list[RefusedAnswer] = field(default_factory=list)
    # Questions asked in every mode, and how many results/refusals they hold: an interrupted run keeps just these,
    # so every mode's rate covers the same questions.
    queries_done: int = 0
    results_done: int = 0
    refused_done: int = 0

    def keep_complete_queries(self) -> None:
        del self.results[self.results_done:]
        del self.refused[self.refused_done:]


class FlatCosine:
    """B_flat_cos: plain cosine over the embedder's vectors of the fact texts, nothing else."""

    def __init__(self, embedder: Embedder, memories: Sequence[MemoryText]) -> None:
        self.embedder = embedder
        self.matrix = np.asarray(embedder.embed([m.text for m in memories]), dtype=np.float32)

    def top(self, question: str, k: int) -> list[int]:
        query = np.asarray(self.embedder.embed([question]), dtype=np.float32)[0]
        scores = self.matrix @ query
        return [int(i) for i in np.argsort(-scores, kind="stable")[:k]]


@dataclass
class _Answered:
    """One mode's answer to one question, from whichever path served it."""

    answer: str
    memories: list[str]  # entry paths, best first
    input_tokens: int
    prefix_tokens: int
    new_tokens: int
    retrieve_ms: float
    compile_ms: float
    ttft_ms: float
    generate_ms: float
    left_out: list[str] = field(default_factory=list)


def _answer_in_process(backbone: Any, compiler: Any, mode: ModeName, question: str, given: Sequence[MemoryText],
                       max_new_tokens: int, retrieve_ms: float) -> _Answered:
    """Answer as amfs_answer does: memories that do not fit the context beside those before them are left out, best
    first (full history reads everything or nothing); `_Refused` when nothing fits or the prompt is refused."""
    generation = GENERATION_MODE[base_mode(mode)]
    kept = (list(range(len(given))) if generation == "full" else
            fitting_memories(backbone, compiler, generation, given, question, max_new_tokens))
    if given and not kept:
        raise _Refused(f"None of the {len(given)} memories given fits {backbone.name}'s context beside the question "
                       f"and max_new_tokens={max_new_tokens}: the best is {given[0].memory_id}")
    try:
        gen = answer_from_memories(backbone, compiler, question, generation, [given[i] for i in kept], max_new_tokens,
                                   key_scale=mode_key_scale(mode))
    except ValidationError as error:  # the prompt past the context, as amfs_answer refuses it
        raise _Refused(str(error)) from None
    m = gen.metrics
    return _Answered(gen.answer, [_entry_path(given[i].memory_id) for i in kept], m.input_tokens, m.prefix_tokens,
                     m.new_tokens, retrieve_ms, gen.compile_ms, m.ttft_ms, m.generate_ms,
                     left_out=[_entry_path(g.memory_id) for i, g in enumerate(given) if i not in kept])


class _InProcess:
    """The session's memories in an ``AsyncAgentMemory`` in this process; answers with the benchmark's backbone."""

    served_by: ServedBy = "in-process"

    def __init__(self, data_dir: Path, embedder: Embedder | None, backbone: Any, compiler: Any) -> None:
        self.data_dir, self.embedder, self.backbone, self.compiler = data_dir, embedder, backbone, compiler
        self.memory: Any = None
        self.load_ms = 0.0

    async def __aenter__(self) -> _InProcess:
        from ..adapters import create_store
        from ..core.service import MemoryService, ServiceConfig
        from ..sdk import AsyncAgentMemory

        store = create_store(self.data_dir / "amfs.db", None,
                             embedding_dimension=self.embedder.dimension if self.embedder else 384)
        service = MemoryService(store, ServiceConfig(), embedder=self.embedder)
        await service.open()  # AsyncAgentMemory takes a given service as open, and closes it
        self.memory = AsyncAgentMemory(agent_id="session-bench", service=service)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.memory.close()

    async def write(self, facts: Sequence[Fact]) -> list[MemoryText]:
        # One write per fact, in the session's order, as a conversation writes them (and as the server
        # path must: amfs_write takes one memory), so recency ranks the same on both paths.
        texts = []
        for f in facts:
            entry = await self.memory.write(f.entity_path, f.key, f.text)
            texts.append(MemoryText.of(entry))
        return texts

    async def answer(self, mode: ModeName, question: str, texts: Sequence[MemoryText], top_k: int,
                     max_new_tokens: int) -> _Answered:
        retrieve_ms = 0.0
        base = base_mode(mode)
        if RETRIEVAL[base] == "none":
            given = list(texts)
        else:
            started = time.perf_counter()
            retrieved = await self.memory.retrieve(question, limit=top_k)
            retrieve_ms = (time.perf_counter() - started) * 1000
            given = [MemoryText.of(hit.entry) for hit in retrieved][:GIVEN.get(base, top_k)]
        return _answer_in_process(self.backbone, self.compiler, mode, question, given, max_new_tokens, retrieve_ms)


class _ViaServer:
    """The session through the real MCP tools: an app from ``create_app`` with the backbone configured,
    its own store, called over an in-memory ``fastmcp.Client``. Metrics come from ``amfs_answer``'s result."""

    served_by: ServedBy = "server"

    def __init__(self, data_dir: Path, backbone_spec: str, embedder_spec: str) -> None:
        self.server = ServedApp(data_dir, backbone_spec, "session bench --via-server", embedder_spec)
        self.load_ms = 0.0

    async def __aenter__(self) -> _ViaServer:
        await self.server.__aenter__()
        if "amfs_answer" not in await self.server.tool_names():
            raise SystemExit("session bench --via-server: the server registered no amfs_answer tool")
        # Warm-up: the worker loads the backbone now, and every generation mode runs once untimed, so first-call
        # costs land nowhere. From one memory of its own, forgotten afterwards (amfs_answer asks nothing of the
        # model without a memory).
        warm_up = {"entity_path": "bench-warm-up", "key": "sky"}
        await self.server.call("amfs_write", {**warm_up, "value": "The sky is blue."})
        for mode in ("full", "text", "prefix", "hybrid"):
            result = await self.server.call("amfs_answer", {"query": "What colour is the sky?", "mode": mode,
                                                            "entity_path": "bench-warm-up", "max_new_tokens": 4})
            self.load_ms += result["metrics"]["load_ms"]
        await self.server.call("amfs_forget", warm_up)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.server.__aexit__(*exc)

    async def write(self, facts: Sequence[Fact]) -> list[MemoryText]:
        texts = []
        for f in facts:
            written = await self.server.call("amfs_write", {"entity_path": f.entity_path, "key": f.key, "value": f.text})
            texts.append(MemoryText(f"{written['entry_key']}@v{written['version']}", memory_text(f.text)))
        return texts

    async def answer(self, mode: ModeName, question: str, texts: Sequence[MemoryText], top_k: int,
                     max_new_tokens: int) -> _Answered:
        # Only the context refusals are one item of the run; any other error (a server fault) ends it rather than
        # pass for a refusal that no rate counts.
        try:
            result = await self.server.call(
                "amfs_answer", {"query": question, "mode": GENERATION_MODE[mode], "max_new_tokens": max_new_tokens,
                                "memories": GIVEN.get(base_mode(mode), top_k)}, refusal=_CONTEXT_REFUSAL,
                about=f"{mode}, {question[:80]!r}")
        except ToolRefused as refused:
            raise _Refused(str(refused)) from None
        m = result["metrics"]
        return _Answered(result["answer"], [u["entry_key"] for u in result["memories"]], m["input_tokens"],
                         m["prefix_tokens"], m["new_tokens"], m["retrieve_ms"] if mode != "D_full_history" else 0.0,
                         m["compile_ms"], m["ttft_ms"], m["generate_ms"],
                         left_out=[u["entry_key"] for u in result.get("left_out", [])])


def _entry_path(memory_id: str) -> str:
    return memory_id.rsplit("@v", 1)[0]


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def check_before_running(sessions: Sequence[Session], backbone: Any, compiler: Any, embedder: Embedder | None,
                         modes: Sequence[ModeName], max_new_tokens: int, *, in_process: bool) -> None:
    """Stop before any session runs on what would be refused whatever retrieval returns, naming all of it: a refusal
    mid-run ended the run and threw away every answer before it (red-team finding, 0.7.12). Full history reads
    every fact and the reference the gold fact, so their prompts are known now; what the retrieval modes read is
    known only once they retrieve, and a refusal there is recorded and the run goes on (``RefusedAnswer``)."""
    from ..ml.answer.prefix_cache import encode

    if "B_flat_cos" in modes and embedder is None:
        raise SystemExit(f"session bench: B_flat_cos needs an embedder; pass --embedder {DEFAULT_EMBEDDER} "
                         "or leave B_flat_cos out of --modes")
    limit = getattr(backbone.config, "max_position_embeddings", None)
    if limit is None:
        return
    compiles = in_process and bool(set(PREFIX_MODES) & {base_mode(m) for m in modes})
    fixed = [m for m in ("D_full_history", ORACLE) if m in modes]
    problems: list[str] = []
    refused_modes: set[ModeName] = set()
    for session in sessions:
        texts = [memory_text(f.text) for f in session.facts]
        if compiles:  # in process every fact is compiled before the first question
            for fact, text in zip(session.facts, texts):
                line = compiler.layout.memory_line(text)
                # Compiling such a fact ran for 10 minutes at 5 GB (23,000 tokens), or asked for 71 GB and died with
                # a traceback (427 KB; red-team finding, 0.7.12).
                if len(line.encode("utf-8")) >= limit and len(encode(backbone, line)) > limit:
                    raise SystemExit(f"session bench: {session.name}: fact {fact.path} is longer than "
                                     f"{backbone.name}'s context ({limit} tokens) on its own, so nothing has run; "
                                     "shorten it or split it into several facts")
        for i, query in enumerate(session.queries):
            needs = []
            for mode in fixed:
                given = texts if mode == "D_full_history" else [memory_text(session.fact(query.fact_path).text)]
                n = prompt_tokens_past_the_context(backbone, compiler, GENERATION_MODE[mode], given, query.question,
                                                    max_new_tokens)
                if n is not None:
                    needs.append(f"{mode} needs {n} prompt tokens")
                    refused_modes.add(mode)
            if needs:
                problems.append(f"{session.name} queries[{i}]: {', '.join(needs)} ({query.question[:60]!r})")
    if problems:
        shown = problems[:20] + ([f"... and {len(problems) - 20} more"] if len(problems) > 20 else [])
        leave = [f"leave {m} out of --modes ({'it reads every fact' if m == 'D_full_history' else 'the gold fact'})"
                 for m in fixed if m in refused_modes]
        raise SystemExit(
            f"session bench: {len(problems)} question(s) cannot be asked in every mode: with up to {max_new_tokens} "
            f"new tokens their prompts are longer than {backbone.name}'s context ({limit} tokens), so nothing has "
            "run:\n  " + "\n  ".join(shown) + "\nTo run: " + "; ".join(leave)
            + "; or shorten those questions or their facts, or lower --max-new-tokens.")


async def run_session(session: Session, backbone: Any, compiler: Any, embedder: Embedder | None,
                      modes: Sequence[ModeName], top_k: int, max_new_tokens: int, *,
                      server: tuple[str, str] | None = None, into: list[SessionRun] | None = None) -> SessionRun:
    """Write the session's facts as memories, then ask every question in every mode (interleaved).

    ``server`` = (backbone spec, embedder spec): write and answer D/B_ams_text/A/C through the MCP tools
    of a server built with them; B_flat_cos and the oracle run here, on the facts the tools wrote.
    ``into``: the run is appended there as soon as it starts, so a caller still holds its answers if the
    session is interrupted.
    """
    with tempfile.TemporaryDirectory(prefix="amfs-session-bench-") as tmp:
        store: _InProcess | _ViaServer = (_ViaServer(Path(tmp), *server) if server is not None
                                          else _InProcess(Path(tmp), embedder, backbone, compiler))
        async with store:
            started = time.perf_counter()
            texts = await store.write(session.facts)
            write_ms = (time.perf_counter() - started) * 1000
            by_path = {_entry_path(t.memory_id): t for t in texts}
            before = compiler.stats.compiled
            started = time.perf_counter()
            if server is None and set(PREFIX_MODES) & {base_mode(m) for m in modes}:
                # What the product does when a memory is written or first used (check_before_running has refused a
                # fact longer than the context on its own).
                for t in texts:
                    compiler.compile(t.memory_id, t.text)
            # Via the server, memories compile on first use inside the worker (each query's compile_ms).
            run = SessionRun(session.name, len(session.facts), len(session.queries), write_ms,
                             (time.perf_counter() - started) * 1000, compiler.stats.compiled - before,
                             served_by=store.served_by, backbone_load_ms=store.load_ms)
            if into is not None:
                into.append(run)
            flat = None
            if "B_flat_cos" in modes:
                if embedder is None:
                    raise SystemExit(f"session bench: B_flat_cos needs an embedder; pass --embedder {DEFAULT_EMBEDDER} "
                                     "or leave B_flat_cos out of --modes")
                flat = FlatCosine(embedder, texts)
            hits = {m: 0 for m in modes}
            answered = {m: 0 for m in modes}
            for qi, query in enumerate(session.queries, start=1):
                for mode in modes:
                    started = time.perf_counter()
                    kind = RETRIEVAL[base_mode(mode)]
                    served_by: ServedBy = "in-process"
                    try:
                        # D and the retrieval modes: the store's path (here, or the server).
                        if base_mode(mode) in SERVER_MODES:
                            served_by = store.served_by
                            got = await store.answer(mode, query.question, texts, top_k, max_new_tokens)
                        else:  # B_flat_cos and the oracle: in process on either path
                            if kind == "flat_cos":
                                assert flat is not None
                                given = [texts[i] for i in flat.top(query.question, top_k)]
                            else:
                                given = [by_path[query.fact_path]]
                            retrieve_ms = (time.perf_counter() - started) * 1000 if kind == "flat_cos" else 0.0
                            got = _answer_in_process(backbone, compiler, mode, query.question, given, max_new_tokens,
                                                     retrieve_ms)
                    except _Refused as refusal:
                        run.refused.append(RefusedAnswer(session.name, qi - 1, query.question, mode, str(refusal),
                                                         served_by))
                        _progress(f"[{session.name}] {mode:<15} query {qi}/{len(session.queries)} REFUSED, left out "
                                  f"of the rates: {refusal}")
                        continue
                    total_ms = (time.perf_counter() - started) * 1000
                    hit = query.hit(got.answer)
                    hits[mode] += hit
                    answered[mode] += 1
                    retrieved = kind not in ("none", "gold")
                    run.results.append(QueryResult(
                        mode=mode, session=session.name, question=query.question, expected=query.expected, hit=hit,
                        gold_retrieved=query.fact_path in got.memories if retrieved else None,
                        gold_rank=(got.memories.index(query.fact_path) + 1
                                   if retrieved and query.fact_path in got.memories else None),
                        total_ms=total_ms, served_by=served_by, hit_lenient=query.hit_lenient(got.answer),
                        distractors=list(query.distractors), **asdict(got),
                    ))
                    _progress(f"[{session.name}] {mode:<15} query {qi}/{len(session.queries)} "
                              f"{'hit ' if hit else 'miss'} running hit-rate {hits[mode]}/{answered[mode]} "
                              f"({hits[mode] / answered[mode]:.0%}) gen {got.generate_ms:.0f} ms  {got.answer[:60]!r}")
                run.queries_done, run.results_done, run.refused_done = qi, len(run.results), len(run.refused)
    return run


# ---------------------------------------------------------------------------
# Aggregation and reports
# ---------------------------------------------------------------------------

def paired_difference_interval(a: Sequence[bool], b: Sequence[bool], seed: int = 0) -> tuple[float, float]:
    """95% percentile-bootstrap interval of mean(a - b) over paired questions (both modes saw each one)."""
    diff = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    if diff.size == 0:
        return (float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    means = diff[rng.integers(0, diff.size, size=(BOOTSTRAP_RESAMPLES, diff.size))].mean(axis=1)
    return (float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5)))


def _hits_by_question(results: Sequence[QueryResult], mode: str) -> dict[tuple[str, str], bool]:
    return {(r.session, r.question): r.hit for r in results if r.mode == mode}


def summarize(results: Sequence[QueryResult], modes: Sequence[ModeName],
              refused: Sequence[RefusedAnswer] = ()) -> dict[str, dict[str, Any]]:
    """Per mode, over the questions it answered (``n``); ``refused`` ones are counted apart and in no rate (None
    where a mode answered nothing)."""
    summary: dict[str, dict[str, Any]] = {}
    oracle = _hits_by_question(results, ORACLE) if ORACLE in modes else None
    for i, mode in enumerate(modes):
        rows = [r for r in results if r.mode == mode]
        n = len(rows)
        hits = sum(r.hit for r in rows)
        gold = [r.gold_retrieved for r in rows if r.gold_retrieved is not None]
        first = [r for r in rows if r.gold_rank == 1]

        def mean(attr: str) -> float | None:
            return float(np.mean([getattr(r, attr) for r in rows])) if rows else None

        def interval(values: list[float], seed: int) -> list[float] | None:
            return list(bootstrap_mean_interval(values, seed=seed)) if values else None

        summary[mode] = {
            "reference": mode == ORACLE,
            "served_by": sorted({r.served_by for r in rows}),
            "n": n, "hits": hits, "hit_rate": hits / n if n else None,
            "hit_rate_ci95": list(wilson_interval(hits, n)),
            "refused": sum(1 for r in refused if r.mode == mode),
            "hits_lenient": sum(r.hit_lenient for r in rows),
            "hit_rate_lenient": sum(r.hit_lenient for r in rows) / n if n else None,
            "answers_with_memories_left_out": sum(1 for r in rows if r.left_out),
            "retrieval_recall": (sum(gold) / len(gold)) if gold else None,
            # The prefix channel bets on the top-1 (key scale): how often retrieval put the gold fact first,
            # and the hit-rate on those questions.
            "gold_first_rate": (len(first) / len(gold)) if gold else None,
            "hit_rate_gold_first": (sum(r.hit for r in first) / len(first)) if first else None,
            "avg_input_tokens": mean("input_tokens"), "avg_prefix_tokens": mean("prefix_tokens"),
            "avg_new_tokens": mean("new_tokens"),
            "avg_retrieve_ms": mean("retrieve_ms"),
            "avg_retrieve_ms_ci95": interval([r.retrieve_ms for r in rows], i),
            "avg_compile_ms": mean("compile_ms"), "avg_ttft_ms": mean("ttft_ms"),
            "avg_generate_ms": mean("generate_ms"),
            "avg_generate_ms_ci95": interval([r.generate_ms for r in rows], 100 + i),
            "avg_total_ms": mean("total_ms"),
            "avg_ms_per_new_token": (sum(r.generate_ms for r in rows) / max(1, sum(r.new_tokens for r in rows))),
        }
        if oracle is not None:
            # Against the reader given the gold fact alone, question by question. Not a ratio of rates: that read
            # 125% where a mode answered a question the reference missed (a weak reader can answer better beside
            # other memories, or by chance; red-team finding, 0.7.12). Two counts that cannot mislead instead: of
            # the reference's hits, how many this mode kept (at most all), and how many it answered beyond them.
            on_hits = [r.hit for r in rows if oracle.get((r.session, r.question))]
            summary[mode]["oracle_hits"] = len(on_hits)
            summary[mode]["hits_on_oracle_hits"] = sum(on_hits)
            summary[mode]["hit_rate_on_oracle_hits"] = sum(on_hits) / len(on_hits) if on_hits else None
            summary[mode]["hits_beyond_oracle"] = sum(
                1 for r in rows if r.hit and oracle.get((r.session, r.question)) is False)
    return summary


def _paired_difference(results: Sequence[QueryResult], mode: ModeName, other: ModeName) -> dict[str, Any] | None:
    """``mode`` minus ``other`` on the questions both answered (all of them, unless some were refused): the mean
    difference, its paired bootstrap CI, and how many questions."""
    mine, theirs = _hits_by_question(results, mode), _hits_by_question(results, other)
    paired = [q for q in mine if q in theirs]
    if not paired:
        return None
    a, b = [mine[q] for q in paired], [theirs[q] for q in paired]
    return {"minus": float(np.mean(a) - np.mean(b)), "paired_ci95": list(paired_difference_interval(a, b)),
            "questions": len(paired)}


def targets(summary: dict[str, dict[str, Any]], results: Sequence[QueryResult]) -> dict[str, Any]:
    """The issue's bar, where the modes it compares were run and answered. Differences of hit-rates are taken on the
    questions both modes answered, so a refused question counts for neither."""
    out: dict[str, Any] = {}
    answered = {m: s for m, s in summary.items() if s["n"]}
    a, b, c, d = (answered.get(m) for m in ("A_ams_prefix", "B_ams_text", "C_ams_hybrid", "D_full_history"))
    # A (and C, and their other key scales) against the best text mode run, not only B_ams_text: a prefix
    # channel that wins only against a weaker text baseline has not earned its place.
    text_run = [m for m in TEXT_MODES if m in answered]
    if text_run:
        best = max(text_run, key=lambda m: (summary[m]["hit_rate"], -TEXT_MODES.index(m)))
        out["best_text_mode"] = best
        for mode in answered:
            if base_mode(mode) not in PREFIX_MODES:
                continue
            difference = _paired_difference(results, mode, best)
            if difference is None:
                continue
            entry: dict[str, Any] = {"minus_best_text": difference["minus"], "paired_ci95": difference["paired_ci95"],
                                     "paired_questions": difference["questions"]}
            out.setdefault("vs_best_text", {})[mode] = entry
    if a and b:
        difference = _paired_difference(results, "A_ams_prefix", "B_ams_text")
        if difference is not None:
            out["A_hit_rate_minus_B_ams_text"] = difference["minus"]
            out["A_hit_rate_at_least_B_ams_text"] = difference["minus"] >= 0
            out["A_minus_B_ams_text_paired_ci95"] = difference["paired_ci95"]
            out["A_minus_B_ams_text_paired_questions"] = difference["questions"]
        out["A_generate_ms_vs_B_ams_text"] = a["avg_generate_ms"] / b["avg_generate_ms"]
        out["A_generate_within_1.1x"] = out["A_generate_ms_vs_B_ams_text"] <= TARGET_GENERATE_RATIO
    if c and b:
        out["C_generate_ms_vs_B_ams_text"] = c["avg_generate_ms"] / b["avg_generate_ms"]
        out["C_generate_within_1.1x"] = out["C_generate_ms_vs_B_ams_text"] <= TARGET_GENERATE_RATIO
    if a and d:
        out["A_input_tokens_vs_D"] = a["avg_input_tokens"] / d["avg_input_tokens"]
        out["A_input_tokens_within_15pct"] = out["A_input_tokens_vs_D"] <= TARGET_INPUT_TOKEN_RATIO
    return out


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def _num(x: float | None, digits: int = 0) -> str:
    """A mean, or "-" for a mode that answered nothing."""
    return "-" if x is None else f"{x:.{digits}f}"


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _cell(text: str) -> str:
    """Text (a question, a refusal's reason) as one markdown table cell."""
    return " ".join(text.split()).replace("|", "\\|")


def _mode_label(mode: str) -> str:
    return f"{mode} (reference: gold fact only)" if mode == ORACLE else mode


def markdown(report: dict[str, Any]) -> str:
    cfg = report["config"]
    sessions = ", ".join(f"{s['session']} ({s['n_facts']} facts, {s['n_queries']} queries)" for s in report["sessions"])
    has_oracle = ORACLE in report["summary"]
    via_server = cfg.get("path") == "server"
    refused = report.get("refused", [])
    lines = [
        f"# Session benchmark: {cfg['backbone']}, {report['title']}",
        "",
        *([f"**Partial report: {report['interrupted']}.**", ""] if report.get("interrupted") else []),
        f"Backbone `{cfg['backbone']}` ({cfg['device']}, {cfg['dtype']}); embedder `{cfg['embedder']}`; "
        f"top-k {cfg['top_k']}; max new tokens {cfg['max_new_tokens']}; greedy; key scale {cfg.get('key_scale')}; "
        f"torch threads {cfg['torch_threads']}. Sessions: {sessions}. "
        "Hit (strict, the default) = the expected keyword as a whole word (case-insensitive) and none of the "
        "question's distractor answers (the same attribute of the other people/services); *lenient* = the "
        "keyword as a substring, the report's original rule. 95% CIs: Wilson for hit-rates (queries of "
        "all sessions pooled), percentile bootstrap of the mean for times."
        + (f" **{len(refused)} answers were refused** (listed below): each rate is over the answers its mode gave "
           "(n), and differences between modes over the questions both answered." if refused else ""),
        "",
        f"Sessions: **{cfg.get('sessions_description', '-')}**.",
        "",
        f"Path: **{cfg.get('path_description', 'in process')}**.",
        "",
    ]
    if has_oracle:
        lines += [
            f"`{ORACLE}` is a reference, not one of the five modes: the reader given only the gold fact as "
            "text, its ceiling under perfect retrieval, though not a strict one (a weak reader can answer beside "
            "other memories what it misses from the gold fact alone). *on O's hits*: of the questions O answers, "
            "the share this mode answers too (at most 100%); *beyond O*: questions this mode answers that O misses.",
            "",
        ]
    oracle_cols = " on O's hits | beyond O |" if has_oracle else ""
    served_col = " served by |" if via_server else ""
    refused_col = " refused |" if refused else ""
    header = (f"| Mode |{served_col} Hit-rate, strict (95% CI) | lenient |{refused_col}{oracle_cols} Gold in top-k "
              "| Gold first (hit-rate then) "
              "| avg input tokens (prefilled) "
              "| avg reused prefix tokens | avg retrieve ms | avg generate ms (95% CI) | avg TTFT ms "
              "| avg new tokens |")
    lines += [header, "|" + "---|" * (header.count("|") - 1)]
    for mode, s in report["summary"].items():
        lo, hi = s["hit_rate_ci95"]
        gen_ci = s["avg_generate_ms_ci95"]
        gen = _num(s["avg_generate_ms"]) + (f" ({gen_ci[0]:.0f}-{gen_ci[1]:.0f})" if gen_ci else "")
        recall = "-" if s["retrieval_recall"] is None else _pct(s["retrieval_recall"])
        first = "-" if s["gold_first_rate"] is None else (
            f"{_pct(s['gold_first_rate'])} ({_pct(s['hit_rate_gold_first'])})")
        served = f" {', '.join(s['served_by'])} |" if via_server else ""
        on_oracle_hits = (f"{_pct(s['hit_rate_on_oracle_hits'])} ({s['hits_on_oracle_hits']}/{s['oracle_hits']})"
                          if has_oracle and s.get("oracle_hits") else "-")
        vs_oracle = (f" {on_oracle_hits} | {s['hits_beyond_oracle']} |" if has_oracle and mode != ORACLE
                     else (" - | - |" if has_oracle else ""))
        refused_cell = f" {s.get('refused', 0)} |" if refused else ""
        rate = f"{_pct(s['hit_rate'])} ({s['hits']}/{s['n']}; {_pct(lo)}-{_pct(hi)})" if s["n"] else "- (0/0)"
        lines.append(
            f"| {_mode_label(mode)} |{served} {rate} |"
            f" {_pct(s.get('hit_rate_lenient'))} |{refused_cell}"
            f"{vs_oracle} {recall} | {first} | {_num(s['avg_input_tokens'])} | {_num(s['avg_prefix_tokens'])} "
            f"| {_num(s['avg_retrieve_ms'], 1)} | {gen} | {_num(s['avg_ttft_ms'])} "
            f"| {_num(s['avg_new_tokens'], 1)} |"
        )
    left_out = {m: s["answers_with_memories_left_out"] for m, s in report["summary"].items()
                if s.get("answers_with_memories_left_out")}
    if left_out:
        lines += ["", "Memories left out (too long for the context beside the ones before them, best first, as "
                  "amfs_answer does; `left_out` in report.json): "
                  + "; ".join(f"{m}: {k} answers read fewer than it was given" for m, k in left_out.items()) + "."]
    if refused:
        lines += ["", f"## Refused: {len(refused)} answers, left out of every rate", "",
                  "Each was refused before the model answered (its prompt past the model's context, or a refused "
                  "tool call): not counted as misses, nor as answers. The run went on without them.", "",
                  "| Session | Question | Asked | Mode | Served by | Why |", "|---|---|---|---|---|---|"]
        lines += [f"| {r['session']} | queries[{r['query_index']}] | {_cell(_cut(r['question'], 80))} | {r['mode']} "
                  f"| {r['served_by']} | {_cell(r['reason'])} |" for r in refused]
    per_session = report.get("per_session", {})
    if len(per_session) > 1:
        modes = list(report["summary"])
        lines += ["", "## Per session (seed)", "", "| Session | " + " | ".join(modes) + " |",
                  "|---|" + "---|" * len(modes)]
        for name, summary in per_session.items():
            lines.append(f"| {name} | " + " | ".join(
                f"{_pct(summary[m]['hit_rate'])} ({summary[m]['hits']}/{summary[m]['n']}"
                + (f", {summary[m]['refused']} refused" if summary[m].get("refused") else "") + ")"
                for m in modes) + " |")
    t = report["targets"]
    lines += ["", "## Targets", ""]
    if not t:
        lines.append("- none to state: the modes they compare were not run, or answered no question")
    if "A_hit_rate_at_least_B_ams_text" in t:
        paired = t.get("A_minus_B_ams_text_paired_ci95")
        ci = f"; paired bootstrap 95% CI {100 * paired[0]:+.0f} to {100 * paired[1]:+.0f}" if paired else ""
        lines.append(f"- A hit-rate >= B_ams_text: **{'met' if t['A_hit_rate_at_least_B_ams_text'] else 'not met'}** "
                     f"(A - B = {100 * t['A_hit_rate_minus_B_ams_text']:+.0f} points{ci})")
    if "best_text_mode" in t:
        for mode, entry in t.get("vs_best_text", {}).items():
            ci = entry.get("paired_ci95")
            ci_text = f"; paired bootstrap 95% CI {100 * ci[0]:+.0f} to {100 * ci[1]:+.0f}" if ci else ""
            on = f" on the {entry['paired_questions']} questions both answered" if refused else ""
            lines.append(f"- {mode} vs the best text mode ({t['best_text_mode']}): "
                         f"{100 * entry['minus_best_text']:+.0f} points{on}{ci_text}")
    if "A_input_tokens_vs_D" in t:
        lines.append(f"- A input tokens <= 15% of D: **{'met' if t['A_input_tokens_within_15pct'] else 'not met'}** "
                     f"({_pct(t['A_input_tokens_vs_D'])} of D)")
    for m in ("A", "C"):
        if f"{m}_generate_ms_vs_B_ams_text" in t:
            lines.append(f"- {m} generate ms <= 1.1x B_ams_text: "
                         f"**{'met' if t[f'{m}_generate_within_1.1x'] else 'not met'}** "
                         f"({t[f'{m}_generate_ms_vs_B_ams_text']:.2f}x)")
    costs = []
    for s in report["sessions"]:
        cost = f"{s['session']}: write {s['write_ms']:.0f} ms"
        if s.get("served_by") == "server":
            cost += f" (through amfs_write), backbone loaded by the server in {s['backbone_load_ms']:.0f} ms"
        else:
            cost += f", compiled {s['memories_compiled']} memories in {s['compile_ms_total']:.0f} ms"
        costs.append(cost)
    lines += ["", "Write-time costs: " + "; ".join(costs) + ".", "", f"Command: `{report['command']}`", ""]
    if cfg.get("is_random_backbone"):
        lines.insert(2, "**The backbone is randomly initialised (a test model): its answers are noise.**\n")
    return "\n".join(lines)


def chart(report: dict[str, Any], path: Path) -> None:
    plt = pyplot()

    summary = report["summary"]
    modes = list(summary)
    x = np.arange(len(modes))
    palette = {"D_full_history": "#7f7f7f", "B_flat_cos": "#9ecae1", "B_ams_text": "#3182bd",
               "B_text_top1": "#6baed6", "A_ams_prefix": "#e6550d", "C_ams_hybrid": "#fd8d3c", ORACLE: "#ffffff"}
    # Other key scales: the base mode's colour, lighter.
    colors = [palette[m] if m in palette else palette[base_mode(m)] + "88" for m in modes]
    hatches = ["xx" if m == ORACLE else "" for m in modes]  # the reference, not a mode
    fig, axes = plt.subplots(1, 3, figsize=(4 + 1.5 * len(modes), 4.6))
    # A mode that answered nothing (every answer refused) is drawn empty, without an interval.
    answered = [bool(summary[m]["n"]) for m in modes]
    rates = [summary[m]["hit_rate"] * 100 if ok else 0.0 for m, ok in zip(modes, answered)]
    # Clipped at 0: at 0/n or n/n the Wilson bound equals the rate up to rounding.
    err = np.clip(np.array([[r - summary[m]["hit_rate_ci95"][0] * 100, summary[m]["hit_rate_ci95"][1] * 100 - r]
                            if ok else [0.0, 0.0] for m, r, ok in zip(modes, rates, answered)]).T, 0, None)
    axes[0].bar(x, rates, color=colors, yerr=err, capsize=4, hatch=hatches, edgecolor="#555555")
    axes[0].set_ylim(0, 105)
    axes[0].set_title("hit-rate % (95% Wilson CI)")
    prefilled = [summary[m]["avg_input_tokens"] or 0.0 for m in modes]
    reused = [summary[m]["avg_prefix_tokens"] or 0.0 for m in modes]
    axes[1].bar(x, prefilled, color=colors, label="prefilled", hatch=hatches, edgecolor="#555555")
    axes[1].bar(x, reused, bottom=prefilled, color="none", edgecolor="#555555", hatch="//", label="reused prefix")
    axes[1].set_title("avg input tokens (prefilled; hatched: reused)")
    axes[1].legend(loc="upper right", fontsize=8)
    gen = [summary[m]["avg_generate_ms"] or 0.0 for m in modes]
    gerr = np.clip(np.array([[g - summary[m]["avg_generate_ms_ci95"][0], summary[m]["avg_generate_ms_ci95"][1] - g]
                             if ok else [0.0, 0.0] for m, g, ok in zip(modes, gen, answered)]).T, 0, None)
    axes[2].bar(x, gen, color=colors, yerr=gerr, capsize=4, hatch=hatches, edgecolor="#555555")
    axes[2].set_title("avg generate ms (95% bootstrap CI)")
    for ax in axes:
        ax.set_xticks(x, [("O_gold_text\n(reference)" if m == ORACLE else m.replace("_", "\n", 1)) for m in modes],
                      fontsize=8)
    fig.suptitle(f"{report['config']['backbone']}: {report['title']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------

def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="amfs-server bench session", description=__doc__.split("\n\n")[0])
    p.add_argument("--backbone", default="smollm2",
                   help="smollm2 (default; CPU), qwen2.5-1.5b, a local model directory, or tiny-random-qwen2 (tests)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--n-facts", type=int, default=10, choices=(10, 20), help="the report's session size")
    p.add_argument("--large", action="store_true", help="generated sessions (60 facts, 60 queries each) per seed")
    p.add_argument("--large-facts", type=int, default=LARGE_FACTS, help="facts per generated session")
    p.add_argument("--large-queries", type=int, default=None, help="queries per generated session (default: all)")
    p.add_argument("--seeds", default=None,
                   help=f"comma-separated seeds for --large (default: the split's first; reporting seeds "
                        f"{REPORTING_SEEDS.start}-{REPORTING_SEEDS.stop - 1}, tuning seeds "
                        f"{TUNING_SEEDS.start}-{TUNING_SEEDS.stop - 1})")
    p.add_argument("--split", choices=("report", "tuning"), default="report",
                   help="--large: which seed range the run may use. Knobs are chosen on tuning seeds; a report "
                        "runs on reporting seeds only, and each refuses the other's seeds")
    p.add_argument("--session-file", type=Path, default=None,
                   help="run an external session (JSON: name, facts [{entity_path, key, text}], queries "
                        "[{question, expected, fact_path, distractors?}]); see session_bench/data/example_session.json")
    p.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS)
    p.add_argument("--modes", default=",".join(ALL_MODES),
                   help="comma-separated subset of " + ", ".join(ALL_MODES) + f" (default: all; {ORACLE} is the "
                        "reference: the gold fact alone as text)")
    p.add_argument("--top-k", type=int, default=DEFAULT_TOP_K, help="memories given to the retrieval modes")
    p.add_argument("--key-scale", type=float, default=None,
                   help="prefix modes: multiply the keys of memories after the top-1 (below 1 trusts the top-1 "
                        "more; default 0.6, chosen on tuning seeds; 1.0 = plain concatenation)")
    p.add_argument("--key-scales-beside", default=DEFAULT_KEY_SCALES_BESIDE,
                   help="comma-separated key scales at which A and C also run, reported beside the default "
                        f"(default {DEFAULT_KEY_SCALES_BESIDE}; 'none' for none; not with --via-server)")
    p.add_argument("--via-server", action="store_true",
                   help="write the facts and answer D, B_ams_text, A and C through the MCP tools (amfs_write, "
                        "amfs_answer) of a server app with the backbone configured (placed by the server: CUDA "
                        "when available); B_flat_cos and the oracle, which have no server equivalent, run in process")
    p.add_argument("--embedder", default=DEFAULT_EMBEDDER, help=f"{DEFAULT_EMBEDDER} (default), all-MiniLM-L6-v2 (torch, [lm]) or none")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--out", type=Path, default=None,
                   help="report directory (default reports/session/<backbone>-n<N>, -large, +-server)")
    args = p.parse_args(argv)
    args.mode_list = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in args.mode_list if m not in ALL_MODES and not _is_variant(m)]
    if unknown or not args.mode_list:
        p.error(f"unknown modes {unknown}; choose from {', '.join(ALL_MODES)} (or A_ams_prefix@ks<scale>, "
                "C_ams_hybrid@ks<scale>)")
    named_variants = [m for m in args.mode_list if "@" in m]
    if named_variants and args.via_server:
        p.error("--via-server runs the server's key scale only; leave the @ks modes out")
    # Canonical order, each prefix mode's named variants right after it, the reference last.
    args.mode_list = [v for m in ALL_MODES if m in args.mode_list or any(base_mode(n) == m for n in named_variants)
                      for v in [m, *(variant(base_mode(n), mode_key_scale(n)) for n in named_variants
                                     if base_mode(n) == m)]]
    # The ranges amfs_answer takes, so both paths refuse alike and up front (0 new tokens scored 0% for every
    # mode; a NaN key scale gave empty answers, reported as a normal run; red-team finding, 0.7.12).
    if not 1 <= args.top_k <= MAX_MEMORIES:
        p.error(f"--top-k must be in 1..{MAX_MEMORIES} (amfs_answer's memories)")
    if not 1 <= args.max_new_tokens <= 1024:
        p.error("--max-new-tokens must be in 1..1024 (amfs_answer's range)")
    if args.key_scale is not None and not 0 < args.key_scale <= 4:
        p.error("--key-scale must be in (0, 4]")
    from ..ml.answer.prefix_cache import DEFAULT_KEY_SCALE

    beside = args.key_scales_beside.strip().lower()
    try:
        scales = [] if beside in ("", "none") else [float(x) for x in beside.split(",") if x.strip()]
    except ValueError:
        p.error(f"--key-scales-beside takes comma-separated numbers or 'none', got {args.key_scales_beside!r}")
    if any(not 0 < x <= 4 for x in scales):
        p.error("--key-scales-beside: each key scale must be in (0, 4]")
    default_scale = DEFAULT_KEY_SCALE if args.key_scale is None else args.key_scale
    scales = [x for x in dict.fromkeys(scales) if x != default_scale]
    if args.via_server:
        scales = []  # the server runs its own key scale only
    # Each prefix mode's other key scales right after it, so the report prints them side by side.
    args.mode_list = list(dict.fromkeys(v for m in args.mode_list
                                        for v in [m, *(variant(m, x) for x in scales if m in PREFIX_MODES)]))
    if args.session_file is not None and args.large:
        p.error("--session-file and --large are two sources of sessions; give one")
    if args.large:
        try:
            args.seed_list = ([int(s) for s in args.seeds.split(",") if s.strip()] if args.seeds
                              else [(REPORTING_SEEDS if args.split == "report" else TUNING_SEEDS).start])
            check_seeds(args.seed_list, args.split)
        except ValueError as error:
            p.error(f"--split {args.split}: {error}")
        most = most_generated_facts(LARGE_PEOPLE)
        if not 1 <= args.large_facts <= most:
            p.error(f"--large-facts must be 1..{most} (a generated session's {LARGE_PEOPLE} people hold "
                    f"{most // LARGE_PEOPLE} facts each), got {args.large_facts}")
        if args.large_queries is not None and not 1 <= args.large_queries <= args.large_facts:
            p.error(f"--large-queries must be 1..{args.large_facts} (one question per fact), got {args.large_queries}")
    elif args.seeds is not None:
        p.error("--seeds applies to --large (generated sessions) only")
    else:
        args.seed_list = []
    if args.via_server:
        from ..ml.answer.prefix_cache import DEFAULT_KEY_SCALE

        # The server's compiler runs its default key scale; a benchmark that claims the server's answers
        # must run with what the server does.
        if args.key_scale is not None and args.key_scale != DEFAULT_KEY_SCALE:
            p.error(f"--via-server uses the server's key scale ({DEFAULT_KEY_SCALE}); leave --key-scale out")
    args.argv = None if argv is None else list(argv)
    return args


def _slug(spec: str) -> str:
    return "".join(ch if ch.isalnum() or ch in ".-" else "-" for ch in Path(spec).name or spec).strip("-")


def _load(args: argparse.Namespace) -> tuple[Any, Any, Embedder | None]:
    from ..ml.answer.backbone import BackboneUnavailable, load_backbone
    from ..ml.answer.prefix_cache import MemoryCompiler

    try:
        backbone = load_backbone(args.backbone, device=args.device)
    except BackboneUnavailable as error:
        raise SystemExit(f"session bench: {error}") from None
    embedder = None
    if args.embedder.strip().lower() not in ("none", "off", ""):
        from ..adapters.embedders import load_embedder

        embedder = load_embedder(args.embedder)
    scale = {} if args.key_scale is None else {"key_scale": args.key_scale}
    return backbone, MemoryCompiler(backbone, **scale), embedder


def _warm_up(backbone: Any, compiler: Any) -> None:
    """One untimed answer per generation mode, so first-call costs (allocations, kernels) land nowhere."""
    memories = [MemoryText("warm-up/a@v1", "The sky is blue."), MemoryText("warm-up/b@v1", "Grass is green.")]
    for mode in ("text", "prefix", "hybrid"):
        answer_from_memories(backbone, compiler, "What colour is the sky?", mode, memories, 4)


def _session_file(args: argparse.Namespace) -> Session | None:
    """The --session-file session, checked whole (SystemExit naming the file and the place otherwise)."""
    if args.large or args.session_file is None:
        return None
    try:
        session = load_session_file(args.session_file)
    except SessionFileError as error:
        raise SystemExit(f"session bench: {error}") from None
    if args.via_server and "D_full_history" in args.mode_list and len(session.facts) > MAX_FULL_ENTRIES:
        raise SystemExit(f"session bench: {args.session_file}: {len(session.facts)} facts; through the server, mode D "
                         f"(amfs_answer mode='full') reads at most {MAX_FULL_ENTRIES}. Leave D_full_history out of "
                         "--modes, run it in process, or give fewer facts.")
    return session


def run_benchmark(args: argparse.Namespace, *, embedder: Embedder | None = None, loaded: Any = None) -> dict[str, Any]:
    """Run the configured sessions and write the reports; ``loaded`` = (backbone, compiler, embedder) to reuse."""
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    file_session = _session_file(args)  # checked before any model loads: a bad file costs no load
    backbone, compiler, loaded_embedder = loaded if loaded is not None else _load(args)
    embedder = embedder or loaded_embedder
    if args.large:
        check_seeds(args.seed_list, args.split)  # also for callers that built args without parse_args
        sessions = [generated_session(seed, n_people=LARGE_PEOPLE, n_facts=args.large_facts,
                                      n_queries=args.large_queries) for seed in args.seed_list]
        seeds = ",".join(map(str, args.seed_list))
        title = (f"generated sessions x{len(sessions)} ({args.split} seeds {seeds}; {args.large_facts} facts, "
                 f"{len(sessions[0].queries)} queries each)")
        sessions_description = (
            f"generated, {args.split} split, seeds {seeds} (reporting seeds {REPORTING_SEEDS.start}-"
            f"{REPORTING_SEEDS.stop - 1}, tuning seeds {TUNING_SEEDS.start}-{TUNING_SEEDS.stop - 1}; knobs are "
            f"chosen on tuning seeds only)")
        default_out = f"{_slug(args.backbone)}-large" + ("-tuning" if args.split == "tuning" else "")
    elif file_session is not None:
        sessions = [file_session]
        title = f"session file {sessions[0].name} ({len(sessions[0].facts)} facts, {len(sessions[0].queries)} queries)"
        sessions_description = f"external session file {args.session_file}"
        default_out = f"{_slug(args.backbone)}-file-{_slug(sessions[0].name)}"
    else:
        sessions = [report_session(args.n_facts)]
        title = f"report session N={args.n_facts} ({args.n_facts} facts, {len(sessions[0].queries)} queries)"
        sessions_description = f"the report's fixed N={args.n_facts} session"
        default_out = f"{_slug(args.backbone)}-n{args.n_facts}"
    if args.via_server:
        default_out += "-server"
        title += ", through the server"
    out = args.out or Path("reports") / "session" / default_out
    server = (args.backbone, args.embedder) if args.via_server else None
    path_description = (
        "through the server: facts written with amfs_write, D/B_ams_text/A/C answered by amfs_answer "
        "(mode full/text/prefix/hybrid) of a create_app server with the backbone configured, over an in-memory "
        "MCP client; metrics from the tool's result. B_flat_cos and O_gold_text have no server equivalent "
        "and run in process" if args.via_server else "in process (AsyncAgentMemory and the worker's answer code)")
    _progress(f"session bench: {backbone.name} on {backbone.device} ({backbone.dtype}), loaded in "
              f"{backbone.load_seconds:.1f}s; {title}; modes {', '.join(args.mode_list)}; top-k {args.top_k}; "
              f"path: {'server' if args.via_server else 'in-process'}")
    check_before_running(sessions, backbone, compiler, embedder, args.mode_list, args.max_new_tokens,
                         in_process=not args.via_server)
    _warm_up(backbone, compiler)
    started = time.perf_counter()
    runs: list[SessionRun] = []
    interrupted = None
    try:
        for s in sessions:
            asyncio.run(run_session(s, backbone, compiler, embedder, args.mode_list, args.top_k, args.max_new_tokens,
                                    server=server, into=runs))
    except KeyboardInterrupt:
        # Hours of answers are not thrown away: the report covers the questions asked in every mode so far.
        for run in runs:
            run.keep_complete_queries()
        runs = [run for run in runs if run.queries_done]
        if not runs:
            raise
        asked = sum(run.queries_done for run in runs)
        planned = sum(len(s.queries) for s in sessions)
        interrupted = (f"interrupted after {asked} of {planned} questions ({len(runs)} of {len(sessions)} "
                       "sessions begun): every rate covers only the questions asked in every mode")
        _progress(f"session bench: {interrupted}; writing what was answered")
    results = [r for run in runs for r in run.results]
    refused = [r for run in runs for r in run.refused]
    summary = summarize(results, args.mode_list, refused)
    report: dict[str, Any] = {
        "title": title,
        "command": "amfs-server bench session " + " ".join(sys.argv[1:] if args.argv is None else args.argv),
        "config": {
            "backbone": backbone.name, "backbone_spec": args.backbone, "source": backbone.source,
            "is_random_backbone": backbone.is_random, "device": str(backbone.device),
            "dtype": str(backbone.dtype).replace("torch.", ""),
            "embedder": getattr(embedder, "name", "none") if embedder is not None else "none",
            "top_k": args.top_k, "max_new_tokens": args.max_new_tokens, "modes": args.mode_list,
            "reference_modes": [ORACLE] if ORACLE in args.mode_list else [],
            "path": "server" if args.via_server else "in-process", "path_description": path_description,
            "torch_threads": torch.get_num_threads(), "python": platform.python_version(),
            "torch": torch.__version__, "machine": platform.machine(), "order": "interleaved per query",
            "key_scale": compiler.key_scale,
            "key_scales_beside": sorted({mode_key_scale(m) for m in args.mode_list if "@ks" in m}),
            "sessions_description": sessions_description,
            "split": args.split if args.large else None,
            "seeds": list(args.seed_list) if args.large else None,
        },
        "summary": summary,
        "targets": targets(summary, results),
        "per_session": {run.session: summarize(run.results, args.mode_list, run.refused) for run in runs},
        "per_session_targets": {run.session: targets(summarize(run.results, args.mode_list), run.results)
                                for run in runs},
        "sessions": [{k: v for k, v in asdict(run).items() if k not in ("results", "refused", "results_done", "refused_done")}
                     for run in runs],
        "wall_s": time.perf_counter() - started,
        "interrupted": interrupted,
        "queries": [asdict(r) for r in results],
        # Answers that could not run (in no rate above; each mode's `refused` counts its own).
        "refused": [asdict(r) for r in refused],
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
    (out / "report.md").write_text(markdown(report), encoding="utf-8")
    chart(report, out / "report.png")
    _progress(f"session bench: wrote {out}/report.json, report.md, report.png in {report['wall_s']:.0f}s"
              + (f"; {len(refused)} answers refused, left out of the rates (listed in the report)" if refused else ""))
    return report


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    report = run_benchmark(args)
    print(markdown(report))
    if report["interrupted"]:
        raise SystemExit(130)  # a partial report is written, but the run did not finish
    return report


if __name__ == "__main__":
    main()
