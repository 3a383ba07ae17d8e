"""amfs_retrain, amfs_calibrate and amfs_export_training_data end to end through FastMCP's in-memory Client,
with a progress handler that must receive the tools' progress notifications."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from fastmcp import Client, FastMCP

from amfs_server.core.ports import StoreSnapshot
from amfs_server.core.confidence import DEFAULT_MULTIPLIERS
from amfs_server.core.service import MemoryService
from amfs_server.ml import MLService
from amfs_server.ml.export import follow_erasures
from amfs_server.tools import ActorResolver, register_tools
from amfs_server.tools.ml_tools import ML_TOOLS, register_ml_tools

from .conftest import planted_history

Progress = list[tuple[float, float | None, str | None]]


async def build_app(service: MemoryService, export_dir: Path) -> tuple[FastMCP, MLService]:
    app = FastMCP("ml-tools-test")
    actors = ActorResolver(None)
    register_tools(app, service, actors)
    ml = MLService(service, export_dir)
    follow_erasures(service, export_dir)  # as the composition root does for every front end
    await ml.start(watch=False)
    register_ml_tools(app, ml, actors)
    return app, ml


@pytest.fixture
async def ml_client(sim_sqlite: MemoryService, tmp_path: Path) -> AsyncIterator[tuple[Client, Progress]]:
    app, _ = await build_app(sim_sqlite, tmp_path / "exports")
    seen: Progress = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    async with Client(app, progress_handler=on_progress) as client:
        yield client, seen


async def test_ml_tools_are_registered_with_write_annotations_and_tight_schemas(ml_client: tuple[Client, Progress]) -> None:
    client, _ = ml_client
    tools = {tool.name: tool for tool in await client.list_tools()}
    assert ML_TOOLS <= set(tools)
    for name in ML_TOOLS:
        tool = tools[name]
        assert tool.annotations.read_only_hint is False and tool.annotations.destructive_hint is False
        assert tool.description and len(tool.description) < 400
        assert tool.output_schema and tool.output_schema["type"] == "object"
        assert tool.input_schema.get("additionalProperties") is False
    export = tools["amfs_export_training_data"].input_schema["properties"]
    assert set(export["format"]["enum"]) == {"sft", "dpo", "reward_model"}
    assert export["limit"]["default"] == 100


async def test_retrain_over_mcp_reports_metrics_progress_and_puts_the_learned_strategy_in_retrieval(
    ml_client: tuple[Client, Progress], tmp_path: Path
) -> None:
    client, seen = ml_client
    result = await client.call_tool("amfs_retrain", {})
    metrics = result.structured_content
    assert metrics["num_samples"] == metrics["num_positive"] + metrics["num_negative"] > 0
    assert metrics["learned_weight"] == pytest.approx(0.3) and "model_path" not in metrics
    assert len(seen) >= 3 and seen[0][0] == 0 and seen[-1][0] == seen[-1][1]
    assert all(total is not None and done <= total for done, total, _ in seen)
    assert "learned" in (await client.call_tool("amfs_retrieve", {"query": "payments retry", "explain": True})).content[0].text
    retrieved = await client.call_tool("amfs_retrieve", {"query": "payments retry", "explain": True})
    assert any("learned" in hit["explain"] for hit in retrieved.structured_content["results"])


async def test_retrain_with_too_little_data_is_a_tool_error_naming_the_minimum(ml_client: tuple[Client, Progress]) -> None:
    client, _ = ml_client
    result = await client.call_tool("amfs_retrain", {"entity_path": "nothing-here"}, raise_on_error=False)
    assert result.is_error
    text = result.content[0].text
    assert "at least 20 outcome-linked samples" in text and "under 'nothing-here'; found 0" in text


async def test_retrain_without_lightgbm_is_a_tool_error_with_the_install_command_and_writes_no_model(
    ml_client: tuple[Client, Progress], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "lightgbm", None)  # what `import lightgbm` meets when [ml] is not installed
    client, _ = ml_client
    result = await client.call_tool("amfs_retrain", {}, raise_on_error=False)
    assert result.is_error
    text = result.content[0].text
    assert "needs LightGBM" in text and "pip install '.[ml]' (in the amfs-server checkout)" in text
    assert not (tmp_path / "models").exists()


async def test_calibrate_over_mcp_reports_applies_and_reverts(
    sqlite_service: MemoryService, tmp_path: Path
) -> None:
    await sqlite_service.import_snapshot(planted_history(outcomes=600))
    app, _ = await build_app(sqlite_service, tmp_path / "exports")
    seen: Progress = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    async with Client(app, progress_handler=on_progress) as client:
        report = (await client.call_tool("amfs_calibrate", {"per_entity": True})).structured_content
        assert report["applied"] is False and report["global_multipliers"]["entity_path"] is None
        assert report["total_outcomes"] == 600 and report["entity_multipliers"]
        assert report["multipliers_in_force"] == {t.value: m for t, m in DEFAULT_MULTIPLIERS.items()}
        assert seen and seen[-1] == (4, 4, "calibrated")

        both = await client.call_tool("amfs_calibrate", {"apply": True, "revert": True}, raise_on_error=False)
        assert both.is_error and "contradict" in both.content[0].text  # revert used to win silently
        assert sqlite_service.multipliers == DEFAULT_MULTIPLIERS

        applied = (await client.call_tool("amfs_calibrate", {"apply": True})).structured_content
        assert applied["applied"] is True
        assert applied["multipliers_in_force"] == applied["global_multipliers"]["multipliers"]
        assert {t.value: m for t, m in sqlite_service.multipliers.items()} == applied["multipliers_in_force"]

        reverted = (await client.call_tool("amfs_calibrate", {"revert": True})).structured_content
        assert reverted["reverted"] is True and reverted["global_multipliers"] is None
        assert sqlite_service.multipliers == DEFAULT_MULTIPLIERS


async def test_export_over_mcp_returns_examples_or_streams_them_to_a_file_in_the_export_dir(
    ml_client: tuple[Client, Progress], tmp_path: Path
) -> None:
    client, seen = ml_client
    inline = (await client.call_tool("amfs_export_training_data", {"format": "sft", "limit": 2})).structured_content
    assert inline["format"] == "sft" and inline["num_examples"] == len(inline["examples"]) == 2
    assert inline["output_path"] is None

    written = (
        await client.call_tool("amfs_export_training_data", {"format": "dpo", "limit": 5, "output_path": "dpo/train.jsonl"})
    ).structured_content
    target = tmp_path / "exports" / "dpo" / "train.jsonl"
    assert written["output_path"] == str(target) and written["examples"] == []
    assert [set(json.loads(line)) for line in target.read_text().splitlines()] == [{"prompt", "chosen", "rejected"}] * 5
    assert seen and seen[-1][2] == "wrote 5 examples"

    escape = await client.call_tool(
        "amfs_export_training_data", {"format": "sft", "output_path": "../../etc/passwd"}, raise_on_error=False
    )
    assert escape.is_error and "must be a relative file name" in escape.content[0].text
    for odd in ("train\x00.jsonl", "train\n.jsonl"):  # NUL was an internal error; a newline made a file of that name
        refused = await client.call_tool(
            "amfs_export_training_data", {"format": "sft", "output_path": odd}, raise_on_error=False
        )
        assert refused.is_error and "must be a relative file name" in refused.content[0].text


async def test_export_with_nothing_to_export_is_a_tool_error_naming_the_missing_data(
    sqlite_service: MemoryService, simulated_history: StoreSnapshot, tmp_path: Path
) -> None:
    app, _ = await build_app(sqlite_service, tmp_path / "exports")
    async with Client(app) as client:
        result = await client.call_tool("amfs_export_training_data", {"format": "reward_model"}, raise_on_error=False)
    assert result.is_error and "needs at least 1 outcome-linked entry" in result.content[0].text


async def test_ml_tools_compose_with_the_server_app_and_start_up_loads_saved_models(
    simulated_history: StoreSnapshot, tmp_path: Path
) -> None:
    from amfs_server.server.app import create_app
    from amfs_server.server.composition import build_service
    from amfs_server.server.settings import load_settings

    settings = load_settings({}, data_dir=tmp_path / "data", embedder="none")
    earlier = build_service(settings)  # an earlier server run on the same data trained a model
    await earlier.open()
    await earlier.import_snapshot(simulated_history)
    await MLService(earlier, settings.ml_dir / "exports").retrain()
    await earlier.close()
    service = build_service(settings)
    app = create_app(service, settings)
    async with Client(app) as client:
        names = {tool.name for tool in await client.list_tools()}
        assert ML_TOOLS <= names and "amfs_retrieve" in names
        assert service.learned_scorer is not None and service.retrieval_weights()["learned"] == pytest.approx(0.3)


async def test_forgetting_a_memory_takes_the_examples_made_from_it_out_of_the_export_files(
    ml_client: tuple[Client, Progress], tmp_path: Path
) -> None:
    """Red-team repro: a memory forgotten after an export stayed in `<data dir>/ml/exports/...jsonl`, inside the
    data directory that forget promises to leave without a byte of it. Each export file has a sources file beside
    it (the memory versions of each example, line for line): the examples stay as trainers want them."""
    client, _ = ml_client
    for fmt, name in (("sft", "sft.jsonl"), ("dpo", "dpo/train.jsonl"), ("reward_model", "reward.jsonl")):
        done = await client.call_tool("amfs_export_training_data", {"format": fmt, "limit": 40, "output_path": name})
        assert done.structured_content["num_examples"] > 0
    exports = tmp_path / "exports"
    foreign = exports / "mine.jsonl"  # a file this exporter did not write (no sources file): kept as it is
    foreign.write_text('{"text": "kept"}\n')
    files = [exports / "sft.jsonl", exports / "dpo" / "train.jsonl", exports / "reward.jsonl"]
    before = {path: list(zip(path.read_text().splitlines(),
                             path.with_name(path.name + ".amfs-sources").read_text().splitlines(), strict=True))
              for path in files}
    assert set(json.loads(before[files[0]][0][0])) == {"messages"}  # OpenAI fine-tuning refuses other keys
    doomed = json.loads(before[exports / "reward.jsonl"][0][1])[0][0]  # the first reward example's memory

    def made_from(sources: str, entry: str) -> bool:
        return any(source[0] == entry for source in json.loads(sources))

    entity_path, _, key = doomed.rpartition("/")
    forgot = await client.call_tool("amfs_forget", {"entity_path": entity_path, "key": key})
    assert not forgot.is_error
    dropped = 0
    for path, pairs in before.items():
        kept = [pair for pair in pairs if not made_from(pair[1], doomed)]
        assert path.read_text().splitlines() == [example for example, _ in kept], path
        assert path.with_name(path.name + ".amfs-sources").read_text().splitlines() == [line for _, line in kept]
        dropped += len(pairs) - len(kept)
        assert f"{doomed} (v" not in path.read_text() and f'"key": "{key}"' not in path.read_text()
    assert dropped >= 1
    assert foreign.read_text() == '{"text": "kept"}\n'
    assert sorted(p.name for p in exports.rglob("*") if p.is_file()) == sorted(
        [p.name for p in files] + [p.name + ".amfs-sources" for p in files]
        + ["mine.jsonl", ".amfs-exports.lock"])  # no temporary file left
