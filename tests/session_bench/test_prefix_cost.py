"""The prefix-cost benchmark on the tiny random backbone: memory sizes, every mode per cell, break-even, reports."""

from __future__ import annotations

import json

import pytest

from amfs_server.ml.answer.backbone import load_backbone
from amfs_server.ml.answer.prefix_cache import MemoryCompiler, encode
from amfs_server.session_bench import prefix_cost as pc


def test_memories_reach_the_asked_size_and_differ(one_thread):
    bb = load_backbone("tiny-random-qwen2", device="cpu")
    layout = MemoryCompiler(bb).layout
    memories = pc.make_memories(bb, layout, 40, 3)
    sizes = [len(encode(bb, layout.memory_line(m.text))) for m in memories]
    assert all(40 <= s < 60 for s in sizes)
    assert len({m.text for m in memories}) == len({m.memory_id for m in memories}) == 3


def test_cost_report_has_every_mode_per_cell_and_the_prefix_reuses_the_memories(tmp_path, one_thread, capsys):
    out = tmp_path / "cost"
    report = pc.main(["--backbone", "tiny-random-qwen2", "--device", "cpu", "--sizes", "10,40", "--top-k", "2,4",
                      "--reps", "1", "--max-new-tokens", "2", "--out", str(out)])
    assert {p.name for p in out.iterdir()} == {"report.json", "report.md", "report.png"}
    saved = json.loads((out / "report.json").read_text())
    assert [(c["memory_tokens"], c["top_k"]) for c in saved["cells"]] == [(10, 2), (10, 4), (40, 2), (40, 4)]
    for cell in saved["cells"]:
        modes = cell["modes"]
        assert set(modes) == set(pc.COST_MODES)
        # Text prefills every memory; prefix prefills only the question and reuses the k compiled memories.
        assert modes["prefix"]["avg_input_tokens"] < modes["text_top1"]["avg_input_tokens"] \
            < modes["text_topk"]["avg_input_tokens"]
        assert modes["prefix"]["avg_prefix_tokens"] > cell["top_k"] * cell["memory_tokens"] * 0.9
        assert modes["text_topk"]["avg_prefix_tokens"] == 0
        assert cell["compile_ms_per_memory"] > 0
        saved_ms = modes["text_topk"]["median_ttft_ms"] - modes["prefix"]["median_ttft_ms"]
        assert cell["break_even_questions"] == (pytest.approx(cell["top_k"] * cell["compile_ms_per_memory"] / saved_ms)
                                                if saved_ms > 0 else None)
    assert len(saved["crossover"]) == 2 and "randomly initialised" in (out / "report.md").read_text()


def test_via_server_writes_each_cells_memories_and_answers_every_mode_through_amfs_answer(tmp_path, one_thread,
                                                                                         monkeypatch):
    from amfs_server.tools import answer_tools

    calls: list[dict] = []
    real_register = answer_tools.register_answer_tools

    def spying_register(mcp, service, worker, actors):  # record what every amfs_answer call gives the worker
        real_answer = worker.answer

        async def answer(service, actor, query, mode="prefix", entity_path=None, max_new_tokens=64, memories=3):
            got = await real_answer(service, actor, query, mode, entity_path, max_new_tokens, memories)
            calls.append({"mode": mode, "scope": entity_path, "asked": memories, "used": len(got.memories)})
            return got

        worker.answer = answer
        real_register(mcp, service, worker, actors)

    monkeypatch.setattr(answer_tools, "register_answer_tools", spying_register)
    out = tmp_path / "cost-server"
    report = pc.main(["--backbone", "tiny-random-qwen2", "--device", "cpu", "--sizes", "10", "--top-k", "2,4",
                      "--reps", "1", "--max-new-tokens", "2", "--via-server", "--out", str(out)])
    assert report["config"]["path"] == "server" and report["server_backbone_load_ms"] > 0
    assert "through the server" in (out / "report.md").read_text()
    timed = [c for c in calls if c["scope"] and c["scope"].startswith("cost-")]
    # Per cell: one untimed compiling prefix call, then each mode once (reps 1), scoped to the cell's memories.
    assert [(c["scope"], c["mode"], c["asked"]) for c in timed] == [
        ("cost-10x2", "prefix", 2), ("cost-10x2", "text", 2), ("cost-10x2", "text", 1), ("cost-10x2", "prefix", 2),
        ("cost-10x2", "hybrid", 2),
        ("cost-10x4", "prefix", 4), ("cost-10x4", "text", 4), ("cost-10x4", "text", 1), ("cost-10x4", "prefix", 4),
        ("cost-10x4", "hybrid", 4)]
    assert all(c["used"] == c["asked"] for c in timed)  # the scope holds exactly the cell's memories
    for cell in report["cells"]:
        modes = cell["modes"]
        assert cell["memories_compiled"] == cell["top_k"] and cell["compile_ms_per_memory"] > 0
        assert modes["prefix"]["avg_input_tokens"] < modes["text_topk"]["avg_input_tokens"]
        assert modes["prefix"]["avg_prefix_tokens"] > 0 == modes["text_topk"]["avg_prefix_tokens"]
        for mode in pc.COST_MODES:  # the client's wall time holds the tool's own TTFT
            assert modes[mode]["median_total_ms"] >= modes[mode]["median_ttft_ms"] > 0


def test_crossover_names_the_sizes_where_prefix_starts_sooner():
    def cell(size, saves):
        return {"memory_tokens": size, "top_k": 3, "prefix_saves_ttft_ms": saves}

    assert pc.crossover([cell(30, -5), cell(100, 2), cell(300, 40)]) == [
        "top-3: prefix starts answering sooner at 100, 300 tokens per memory, not at 30"]
    assert "never" in pc.crossover([cell(30, -1)])[0]


def test_bad_sizes_are_refused(capsys):
    with pytest.raises(SystemExit):
        pc.parse_args(["--sizes", "30,abc"])
    assert "comma-separated integers" in capsys.readouterr().err
