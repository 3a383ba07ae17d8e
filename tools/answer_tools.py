"""amfs_answer: answer a question from memories with the server's local LM (the prefix channel).

`register_answer_tools(mcp, service, worker, actors)` registers it; the server does so only when a
backbone is configured (`AMFS_LM_BACKBONE` / `serve --lm-backbone`). The tool is one `LMWorker.answer`
call: retrieval through the MemoryService (counted as the session's reads), generation in the worker's
own thread, never on the event loop.
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastmcp import Context, FastMCP
from pydantic import BaseModel, Field

from ..core.service import MAX_QUERY_CHARS, MemoryService
from ..ml.answer.worker import DEFAULT_MEMORIES, MAX_MEMORIES, LMWorker
from ._params import EntityFilter
from ._registry import ActorResolver, ToolRegistry, read_only
from ._views import Score

ANSWER_TOOLS = frozenset({"amfs_answer"})


class UsedMemory(BaseModel):
    entry_key: str
    version: int
    rank: int = Field(description="1 = best; the order the memories were given to the model.")


class LeftOutMemory(BaseModel):
    entry_key: str
    version: int


class AnswerMetrics(BaseModel):
    input_tokens: int = Field(description="Tokens prefilled by this call (prompt text the model read now).")
    prefix_tokens: int = Field(description="Tokens reused from compiled memory caches (prefix/hybrid; 0 otherwise).")
    new_tokens: int
    retrieve_ms: Score
    compile_ms: Score = Field(description="Getting compiled caches; near 0 when every memory was compiled before.")
    compiled_now: int = Field(description="Memories compiled by this call (the rest came from the cache).")
    ttft_ms: Score
    generate_ms: Score = Field(description="Prefix assembly, prefill and decoding.")
    load_ms: Score = Field(description="Loading the backbone; > 0 only on the first call.")
    queue_ms: Score = Field(description="Waiting for another answer to finish.")


class AnswerResult(BaseModel):
    answer: str
    mode: Literal["prefix", "hybrid", "text", "full"]
    backbone: str
    memories: list[UsedMemory]
    left_out: list[LeftOutMemory] = Field(
        default_factory=list, exclude_if=lambda left: not left,
        description="Retrieved memories the model did not get: each too long to fit its context beside the question "
                    "and the memories before it (amfs_read returns them).")
    metrics: AnswerMetrics


def register_answer_tools(mcp: FastMCP, service: MemoryService, worker: LMWorker, actors: ActorResolver) -> None:
    tools = ToolRegistry[LMWorker](mcp, worker, actors)

    @tools.tool(read_only("Answer from memories"))
    async def amfs_answer(
        query: Annotated[str, Field(min_length=1, max_length=MAX_QUERY_CHARS, description="The question.")],
        ctx: Context,
        mode: Annotated[
            Literal["prefix", "hybrid", "text", "full"],
            Field(description="prefix: retrieved memories as compiled caches; hybrid: plus the top one as text; "
                              "text: retrieved memories in the prompt; "
                              "full: every memory under entity_path, oldest first."),
        ] = "prefix",
        entity_path: EntityFilter = None,
        max_new_tokens: Annotated[int, Field(ge=1, le=1024)] = 64,
        memories: Annotated[int, Field(ge=1, le=MAX_MEMORIES, description=(
            "How many of the top retrieved memories the model gets (prefix/hybrid/text; full ignores it)."))
        ] = DEFAULT_MEMORIES,
    ) -> AnswerResult:
        """Answer a question from stored memories with the server's local language model. prefix (default)
        injects the top retrieved memories as cached model state, so only the question is read. Returns
        the answer, the memories used (counted as reads) and token/time metrics."""
        result = await worker.answer(service, tools.actor(ctx), query, mode, entity_path, max_new_tokens,
                                     memories=memories)
        m = result.metrics
        return AnswerResult(
            answer=result.answer, mode=result.mode, backbone=result.backbone,
            memories=[UsedMemory(entry_key=e.entry_key, version=e.version, rank=i)
                      for i, e in enumerate(result.memories, start=1)],
            left_out=[LeftOutMemory(entry_key=e.entry_key, version=e.version) for e in result.left_out],
            metrics=AnswerMetrics(
                input_tokens=m.input_tokens, prefix_tokens=m.prefix_tokens, new_tokens=m.new_tokens,
                retrieve_ms=result.retrieve_ms, compile_ms=result.compile_ms, compiled_now=result.compiled_now,
                ttft_ms=m.ttft_ms, generate_ms=m.generate_ms, load_ms=result.load_ms, queue_ms=result.queue_ms,
            ),
        )


__all__ = ["ANSWER_TOOLS", "register_answer_tools"]
