"""session_bench/mcp_latency.py's concurrent mode: calls go out N at a time and each is timed (a stand-in session;
the real server runs in the README's command)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from amfs_server.session_bench import mcp_latency


class SlowSession:
    """Answers every call after `delay_s`; records how many calls were in flight at once."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s, self.in_flight, self.most, self.asked = delay_s, 0, 0, []

    async def call_tool(self, tool: str, arguments: dict) -> SimpleNamespace:
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        self.asked.append((tool, arguments["query"]))
        await asyncio.sleep(self.delay_s)
        self.in_flight -= 1
        return SimpleNamespace(is_error=False, content=[])


def test_concurrent_retrieves_keep_n_calls_in_flight_and_time_each():
    session = SlowSession(0.05)
    queries = [f"q{n}" for n in range(10)]
    stats = asyncio.run(mcp_latency.concurrent_retrieves(session, queries, 4))
    assert session.most == 4 and [q for _, q in session.asked] == queries  # groups of 4, 4, 2, every query once
    assert stats["n"] == 10 and stats["concurrent"] == 4 and stats["p50_ms"] >= 50
    # Three rounds of at least 50 ms for ten calls: at most ~67/s, and well above one at a time (10 x 50 ms: 20/s).
    assert 25 < stats["calls_per_s"] <= 10 / 0.15 + 0.1


def test_concurrent_must_be_at_least_one():
    with pytest.raises(SystemExit):
        mcp_latency.main(["--concurrent", "0"])
