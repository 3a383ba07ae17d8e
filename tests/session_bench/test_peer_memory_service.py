"""scripts/peer_memory_service.py's harness (the peer itself needs its own venv: the record's figures come from it)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from .scripts_dir import script

CONVERSATION = {
    "conversation_id": "c1", "split": "test",
    "sessions": [{"session": 1, "date": "2023-05-01", "turns": [
        {"key": "D1:1", "speaker": "Ana", "text": "I adopted a kitten.\nHer name is Miso."},
        {"key": "D1:2", "speaker": "Ben", "text": "lol"},
        {"key": "D1:3", "speaker": "Ben", "text": "lol"},
        {"key": "D1:4", "speaker": "Ben", "text": "I moved to Porto last week."},
    ]}],
    "questions": [{"id": "q1", "question": "What is the kitten called?", "kind": "single-hop", "evidence": ["D1:1"]}],
}


def answer(text: str, error: bool = False) -> SimpleNamespace:
    return SimpleNamespace(content=[SimpleNamespace(text=text)], is_error=error)


class Peer:
    """Answers as mcp-memory-service 12.4.0 does: refuses the second identical turn, lists results as numbered text."""

    def __init__(self, store_failure: str | None = None) -> None:
        self.stored: list[str] = []
        self.store_failure = store_failure

    async def call_tool(self, name: str, arguments: dict) -> SimpleNamespace:
        if name == "memory_store":
            if self.store_failure:
                return answer(self.store_failure)
            if arguments["content"] in self.stored:
                return answer("Error storing memory: Duplicate content detected (exact match)")
            self.stored.append(arguments["content"])
            return answer("Memory stored successfully (hash: 11aa)")
        results = [self.stored[0], self.stored[1], "Someone: a text no turn holds"]
        body = "".join(f"{n}. {content}\n   Hash: {n:04x}\n   Created: 2026-12-02\n\n"
                       for n, content in enumerate(results, 1))
        return answer(f"Found {len(results)} memories (mode: semantic) for query: '{arguments['query']}'\n\n{body}")


def test_the_peer_harness_reads_answers_as_turn_keys_and_counts_refused_turns():
    module = script("peer_memory_service")
    ranked, refused = asyncio.run(module.store_and_ask(Peer(), CONVERSATION))
    assert refused == ["D1:3"]  # Ben's second "lol"
    # a turn of two lines is read whole; a text two turns share names both; a text of no turn is skipped
    assert ranked == [["D1:1", "D1:2", "D1:3"]]


def test_the_peer_harness_stops_on_a_store_failure_that_is_not_a_duplicate():
    module = script("peer_memory_service")
    with pytest.raises(RuntimeError, match="memory_store failed on D1:1: Error storing memory: disk full"):
        asyncio.run(module.store_and_ask(Peer(store_failure="Error storing memory: disk full"), CONVERSATION))
