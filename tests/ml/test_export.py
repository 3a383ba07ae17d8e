"""Training-data export: every JSONL line checked on its own, file streaming, filters, and empty-result messages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from amfs_server.core.errors import InsufficientDataError, ValidationError
from amfs_server.core.models import Actor
from amfs_server.core.service import MemoryService, WriteRequest
from amfs_server.ml import ExportFormat, TrainingDataExporter
from amfs_server.ml.export import REWARD_LABELS


def lines(text: str) -> list[dict]:
    assert text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


async def test_sft_lines_are_chat_examples_from_clean_traces_with_two_or_more_reads(sim_service: MemoryService) -> None:
    exporter = TrainingDataExporter(sim_service)
    examples = lines(await exporter.export_jsonl(ExportFormat.SFT))
    assert examples
    for example in examples:
        assert set(example) == {"messages"}  # OpenAI fine-tuning rejects other top-level keys
        assert [m["role"] for m in example["messages"]] == ["system", "user", "assistant"]
        assert all(isinstance(m["content"], str) and m["content"] for m in example["messages"])
        user, assistant = example["messages"][1]["content"], example["messages"][2]["content"]
        assert user.startswith("Memories read:\n1. ") and "\n2. " in user
        decision = json.loads(assistant)
        for write in decision if isinstance(decision, list) else [decision]:
            assert {"entity_path", "key", "value", "memory_type", "confidence"} <= set(write)
            assert write["key"] not in user  # the decision is not part of its own context


async def test_dpo_lines_pair_a_clean_and_a_failed_trace_of_one_entity_under_a_shared_prompt(
    sim_service: MemoryService,
) -> None:
    examples = lines(await TrainingDataExporter(sim_service).export_jsonl("dpo", limit=50))
    assert 0 < len(examples) <= 50
    for example in examples:
        assert set(example) == {"prompt", "chosen", "rejected"}
        assert [m["role"] for m in example["prompt"]] == ["system", "user"]
        assert [m["role"] for m in example["chosen"]] == [m["role"] for m in example["rejected"]] == ["assistant"]
        assert example["prompt"][1]["content"].startswith("Task on 'svc-")
        assert example["chosen"][0]["content"].startswith("Relied on:\n")
        assert example["chosen"][0]["content"] != example["rejected"][0]["content"]


async def test_reward_lines_label_each_outcome_linked_entry_from_its_outcome_history(sim_service: MemoryService) -> None:
    examples = lines(await TrainingDataExporter(sim_service).export_jsonl("reward_model"))
    records = await sim_service.outcome_records()
    history: dict[str, list[str]] = {}
    for record in records:
        for effect in record.effects:
            history.setdefault(effect.entry_key, []).append(record.outcome_type)
    assert len(examples) == len(history)
    for example in examples:
        assert set(example) == {"entry", "label", "outcome_type", "outcome_count"}
        types = history[example["entry"]["entry_key"]]
        assert example["outcome_count"] == len(types)
        assert example["label"] == pytest.approx(sum(REWARD_LABELS[t] for t in types) / len(types), abs=1e-4)
        assert -1.0 <= example["label"] <= 1.0 and example["outcome_type"] in {t.value for t in types}
        assert "embedding" not in example["entry"]


async def test_export_result_has_the_documented_shape_and_honours_limit_and_entity_path(sim_sqlite: MemoryService) -> None:
    result = (await TrainingDataExporter(sim_sqlite).export("reward_model", entity_path="svc-1", limit=3)).to_dict()
    assert {"format", "num_examples", "examples", "exported_at"} <= set(result)
    assert result["format"] == "reward_model" and result["num_examples"] == len(result["examples"]) == 3
    assert all(e["entry"]["entity_path"] == "svc-1" for e in result["examples"])
    with pytest.raises(ValidationError, match="Unknown export format"):
        await TrainingDataExporter(sim_sqlite).export("csv")


async def test_write_jsonl_streams_lines_to_a_file_and_reports_the_count(sim_sqlite: MemoryService, tmp_path: Path) -> None:
    target = tmp_path / "out" / "sft.jsonl"
    seen: list[tuple[float, float | None]] = []
    result = await TrainingDataExporter(sim_sqlite).write_jsonl(
        target, "sft", limit=2, progress=lambda done, total, message: seen.append((done, total))
    )
    assert result.output_path == str(target) and result.num_examples == 2 and result.examples == []
    assert [set(json.loads(line)) for line in target.read_text().splitlines()] == [{"messages"}] * 2
    assert seen[-1] == (3, 3) and not list(target.parent.glob("*.partial"))


async def test_an_empty_export_explains_which_data_is_missing(sqlite_service: MemoryService, tmp_path: Path) -> None:
    exporter = TrainingDataExporter(sqlite_service)
    with pytest.raises(InsufficientDataError, match="Reward-model export needs at least 1 outcome-linked entry"):
        await exporter.export("reward_model")
    actor = Actor("agent/x", "only-success")
    await sqlite_service.write(actor, WriteRequest("svc", "a", "first"))
    await sqlite_service.read(actor, "svc", "a")
    await sqlite_service.commit_outcome(actor, "deploy-1", "success")
    with pytest.raises(InsufficientDataError, match=r"SFT export needs .* 2\+ entries .*1 clean traces, 0 of them"):
        await exporter.export("sft")
    with pytest.raises(InsufficientDataError, match=r"DPO export needs.*only clean traces: \['svc'\]"):
        await exporter.export("dpo")
    with pytest.raises(InsufficientDataError):
        await exporter.write_jsonl(tmp_path / "x.jsonl", "sft")
    assert not (tmp_path / "x.jsonl").exists()


def test_an_export_whose_sources_file_does_not_match_it_line_for_line_is_not_trusted(tmp_path) -> None:
    """An edited file: its lines can no longer be told apart, so a scrub leaves it alone (the server logs it) rather
    than drop the wrong examples. (A crash between an export's two renames is found by its mark and the pair
    deleted: tests/ml/test_export_confinement.py.)"""
    from amfs_server.ml.export import drop_dead_examples, export_files, sources_in

    export = tmp_path / "sft.jsonl"
    export.write_text('{"messages": ["a"]}\n{"messages": ["b"]}\n')
    sources = tmp_path / "sft.jsonl.amfs-sources"
    sources.write_text('[["svc/a", 1]]\n')  # one line short
    assert export_files(tmp_path) == [export] and sources_in(export) is None
    sources.write_text('[["svc/a", 1]]\n[["svc/b", 2], ["svc/a", 1]]\n')
    assert sources_in(export) == {("svc/a", 1, None), ("svc/b", 2, None)}  # before 0.7.14: no write time
    assert drop_dead_examples(export, {("svc/a", 1, None)}, tmp_path) == 1
    assert export.read_text() == '{"messages": ["a"]}\n' and sources.read_text() == '[["svc/a", 1]]\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sft.jsonl", "sft.jsonl.amfs-sources"]
    (tmp_path / "other.jsonl").write_text("{}\n")  # no sources file: not an export this server can scrub
    assert export_files(tmp_path) == [export]
