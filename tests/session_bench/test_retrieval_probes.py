"""scripts/probe_wide_look.py and scripts/retrieve_breakdown.py on small stores (the record's 0.7.19 figures come from
them on the real data)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from amfs_server.core import service as service_module
from amfs_server.core.models import utcnow
from amfs_server.core.ports import EntryFilter
from amfs_server.server.composition import build_service
from amfs_server.server.settings import load_settings
from amfs_server.session_bench import mcp_latency

from .scripts_dir import script


def test_the_wide_look_keeps_the_pools_size_of_the_best_second_look_scores_among_the_wider_pool(tmp_path, monkeypatch):
    env = mcp_latency.server_env(tmp_path / "store", AMFS_EMBEDDER="chat-minilm")
    asyncio.run(mcp_latency.preload(env, 60, real_vectors=12))
    shipped = service_module.MemoryService._semantic_candidates
    asked: list[int] = []

    async def recording(self, query, flt, now, pool_size, keep=None):
        asked.append(pool_size)
        return await shipped(self, query, flt, now, pool_size, keep)

    monkeypatch.setattr(service_module.MemoryService, "_semantic_candidates", recording)  # restored after the test

    async def candidates(pool: int) -> list[tuple[str, float]]:
        service = build_service(load_settings(environ=env))
        await service.open()
        try:
            found = await service._semantic_candidates("who booked the pottery class?", EntryFilter(), utcnow(), pool)
            return [(entry.entry_key, round(score, 6)) for entry, score in found]
        finally:
            await service.close()

    everything = asyncio.run(candidates(60))  # every turn, ranked by the second look
    script("probe_wide_look").widen(400)
    wide = asyncio.run(candidates(10))
    assert asked == [60, 400]  # the store was asked for the wider pool
    assert len(wide) == 10 and wide == everything[:10]  # and the best ten of it by the second look were kept


def test_the_breakdown_times_the_retrieve_its_store_calls_and_the_embedding_and_puts_the_embedder_back(tmp_path):
    env = mcp_latency.server_env(tmp_path / "store", AMFS_EMBEDDER="chat-minilm")
    asyncio.run(mcp_latency.preload(env, 60, real_vectors=12))
    before = service_module.embed_queries
    rows = asyncio.run(script("retrieve_breakdown").breakdown(env, 20))
    assert service_module.embed_queries is before
    assert {"retrieve", "retrieve, question's vector cached", "the same, scoped to one conversation",
            "the question's embedding alone"} <= set(rows)
    assert any(label.strip().startswith("semantic_candidates (x1.0") for label in rows)
    assert all(value > 0 for value in rows.values())


def test_the_breakdown_over_mcp_times_a_retrieve_and_the_cheapest_call_through_a_real_server(tmp_path):
    env = mcp_latency.server_env(tmp_path / "store", AMFS_EMBEDDER="chat-minilm")
    asyncio.run(mcp_latency.preload(env, 60, real_vectors=12))
    rows = asyncio.run(script("retrieve_breakdown").over_mcp(env, 5))
    assert set(rows) == {"over MCP stdio: amfs_retrieve", "over MCP stdio: amfs_read of an absent key"}
    # a retrieve embeds the question and searches; reading an absent key does neither
    assert rows["over MCP stdio: amfs_retrieve"] > rows["over MCP stdio: amfs_read of an absent key"] > 0


def test_the_exact_scan_comparison_embeds_real_turns_and_scores_the_graph_against_the_exact_scan():
    module = script("exact_scan_threshold")
    turns, questions = module.turns_and_questions(seed=0)
    assert len(turns) > 10_000 and len(questions) > 5_000 and all(": " in turn for turn in turns[:50])
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((300, 16)).astype(np.float32)
    asked = vectors[:20] + 0.01  # each question next to a stored vector
    (row,) = module.compare(vectors, asked, [300], k=10)
    assert row["vectors"] == 300 and 0.9 <= row["recall@10"] <= 1.0 and 0.9 <= row["top_ten"] <= 1.0
    assert row["exact_p50_ms"] > 0 and row["graph_p50_ms"] > 0


def test_the_exact_scan_bound_is_in_vector_components():
    from amfs_server.adapters.vector_index import EXACT_SCAN_COMPONENTS, VectorIndex

    assert VectorIndex(768).exact_threshold == EXACT_SCAN_COMPONENTS // 768 == 3906  # chat-mpnet
    assert VectorIndex(384).exact_threshold == 7812  # MiniLM: a vector of half the width scans in half the time
    assert VectorIndex(768, exact_threshold=5).exact_threshold == 5


def test_the_paired_retrieves_time_both_searches_on_a_store(tmp_path):
    env = mcp_latency.server_env(tmp_path / "store", AMFS_EMBEDDER="chat-minilm")
    asyncio.run(mcp_latency.preload(env, 60, real_vectors=12))
    found = asyncio.run(script("exact_scan_threshold").paired_retrieves(tmp_path / "store", rounds=2, questions=5,
                                                                            embedder="chat-minilm"))
    assert set(found) == {"exact scan", "graph"} and all(len(p50s) == 2 and min(p50s) > 0 for p50s in found.values())


def test_the_paired_latency_asks_each_question_of_a_baseline_server_running_the_baseline_code(tmp_path):
    module = script("paired_latency")
    baseline = module.unpack_baseline("HEAD", tmp_path / "baseline")
    marker = tmp_path / "baseline-imported"
    with (baseline / "amfs_server" / "__init__.py").open("a") as init:  # only the baseline's copy leaves this mark
        init.write(f"\nimport pathlib as _p; _p.Path({str(marker)!r}).write_text('yes')\n")
    env = mcp_latency.server_env(tmp_path / "store", AMFS_EMBEDDER="chat-minilm")
    env.pop("PYTHONPATH", None)
    asyncio.run(mcp_latency.preload(env, 60, real_vectors=12))
    assert not marker.exists()
    rows = asyncio.run(module.paired(env, baseline, 4))
    assert marker.read_text() == "yes"
    assert set(rows) == {"amfs_retrieve", "amfs_retrieve, scoped", "amfs_read, absent key"}
    for row in rows.values():
        assert row["baseline p50"] > 0 and row["this checkout p50"] > 0 and 0 <= row["faster here"] <= 4
    with pytest.raises(SystemExit, match="no-such-ref"):
        module.unpack_baseline("no-such-ref", tmp_path / "other")
