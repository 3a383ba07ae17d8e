"""Exports stay inside what they were asked for: an entity filter (a prefix-scoped key's prefix) is a hard
boundary for what an export may contain, and a file export never follows a symbolic link out of its folder."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from amfs_server.core.errors import StoreError, ValidationError
from amfs_server.core.models import Actor
from amfs_server.core.service import MemoryService, WriteRequest
from amfs_server.ml import MLService, TrainingDataExporter
from amfs_server.ml.export import NAME_MAX_BYTES

SECRET = "team-b-secret-value"


async def _session_across_two_teams(service: MemoryService, session: str, outcome: str, ref: str) -> None:
    """One session reads two team-a entries and team-b's secret, writes a team-a decision, commits an outcome."""
    actor = Actor("agent", session)
    for key in ("x", "y"):
        await service.read(actor, "team-a", key)
    await service.read(actor, "team-b", "secret")
    await service.write(actor, WriteRequest("team-a", f"decision-{session}", "use x and y"))
    await service.commit_outcome(actor, ref, outcome, ["team-a/x", "team-a/y", "team-b/secret"])


@pytest.fixture
async def mixed_history(service: MemoryService) -> MemoryService:
    seed = Actor("seed", "seed")
    await service.write_many(seed, [
        WriteRequest("team-a", "x", "team-a fact x"), WriteRequest("team-a", "y", "team-a fact y"),
        WriteRequest("team-b", "secret", SECRET),
    ])
    await _session_across_two_teams(service, "clean", "success", "OK-1")
    await _session_across_two_teams(service, "failed", "failure", "INC-1")
    return service


@pytest.mark.parametrize("fmt", ["sft", "dpo", "reward_model"])
async def test_an_export_filtered_to_a_prefix_contains_nothing_from_outside_it(
    mixed_history: MemoryService, fmt: str
) -> None:
    exporter = TrainingDataExporter(mixed_history)
    unfiltered = await exporter.export_jsonl(fmt)
    assert "team-b" in unfiltered  # the history does mix the two teams
    scoped = await exporter.export_jsonl(fmt, entity_path="team-a")
    assert scoped.strip()  # team-a's own data is still exported
    assert "team-b" not in scoped and SECRET not in scoped


async def test_a_model_trained_for_a_prefix_reads_only_outcomes_under_it(mixed_history: MemoryService) -> None:
    from amfs_server.ml.traces import OutcomeHistory

    history = await OutcomeHistory.load(mixed_history, "team-a")
    assert {e.entity_path for o in history.outcomes for e in o.effects} == {"team-a"}
    assert {e.entity_path for e in history.events} == {"team-a"}
    assert {p for p, _, _ in history.versions} == {"team-a"}


# -- files ----------------------------------------------------------------------------------------


@pytest.fixture
def ml(sim_sqlite: MemoryService, tmp_path: Path) -> MLService:
    return MLService(sim_sqlite, tmp_path / "exports")


async def test_a_symlinked_folder_inside_the_export_dir_is_refused_and_nothing_is_written_outside(
    ml: MLService, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    ml.export_dir.mkdir(parents=True)
    (ml.export_dir / "link").symlink_to(outside)
    with pytest.raises(ValidationError, match="symbolic link"):
        await ml.export_training_data("reward_model", output_path="link/train.jsonl")
    assert list(outside.iterdir()) == []


async def test_a_planted_partial_symlink_is_replaced_and_its_target_left_untouched(
    ml: MLService, tmp_path: Path
) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    ml.export_dir.mkdir(parents=True)
    (ml.export_dir / "train.jsonl.partial").symlink_to(victim)
    (ml.export_dir / "train.jsonl").symlink_to(victim)  # a link at the final name is replaced too, not written through
    result = await ml.export_training_data("reward_model", limit=3, output_path="train.jsonl")
    assert victim.read_text() == "precious"
    target = ml.export_dir / "train.jsonl"
    assert not target.is_symlink() and len(target.read_text().splitlines()) == result.num_examples == 3
    assert not os.path.lexists(ml.export_dir / "train.jsonl.partial")


async def test_each_namespace_gets_its_own_export_folder(ml: MLService) -> None:
    first = await ml.export_training_data("reward_model", limit=1, output_path="train.jsonl", namespace="key-aaaa")
    second = await ml.export_training_data("reward_model", limit=2, output_path="train.jsonl", namespace="key-bbbb")
    assert first.output_path == str(ml.export_dir / "key-aaaa" / "train.jsonl")
    assert second.output_path == str(ml.export_dir / "key-bbbb" / "train.jsonl")
    assert [len(Path(r.output_path).read_text().splitlines()) for r in (first, second)] == [1, 2]
    assert json.loads(Path(first.output_path).read_text())["outcome_count"] >= 1


@pytest.mark.parametrize(
    "name", ["train.jsonl.amfs-sources", "x.partial", ".amfs-exports.lock", ".amfs-exports.pending", "y.scrub"])
async def test_an_export_may_not_take_the_name_of_the_exports_own_files(ml: MLService, name: str) -> None:
    await ml.export_training_data("reward_model", limit=3, output_path="train.jsonl")
    before = {p.name: p.read_bytes() for p in ml.export_dir.iterdir()}
    with pytest.raises(ValidationError, match="keep for their own files"):
        await ml.export_training_data("reward_model", limit=3, output_path=name)
    # nothing written or replaced: the scrub still finds the first export by its own sources file
    assert {p.name: p.read_bytes() for p in ml.export_dir.iterdir()} == before


async def test_a_name_too_long_for_the_files_kept_beside_it_is_refused_saying_so(ml: MLService) -> None:
    """Names of 250-300 characters read as "another export ... is being written right now" (red-team finding, 0.7.15)."""
    spare = NAME_MAX_BYTES - len(".amfs-sources.partial")
    with pytest.raises(ValidationError, match=rf"the file name is {spare + 1} bytes; .* within {spare} bytes"):
        await ml.export_training_data("reward_model", limit=3, output_path="x" * (spare + 1))
    assert not ml.export_dir.exists() or [p.name for p in ml.export_dir.iterdir() if "x" * 20 in p.name] == []
    done = await ml.export_training_data("reward_model", limit=3, output_path="x" * spare)
    assert Path(done.output_path).name == "x" * spare


async def test_a_failed_export_leaves_no_partial_file(ml: MLService) -> None:
    (ml.export_dir / "folder").mkdir(parents=True)
    with pytest.raises(StoreError, match="Cannot write the export"):
        await ml.export_training_data("reward_model", limit=3, output_path="folder")
    assert sorted(p.name for p in ml.export_dir.iterdir() if "partial" in p.name) == []


async def test_a_history_loaded_without_values_holds_the_same_versions_with_none(mixed_history: MemoryService) -> None:
    """What the ranker and the calibrator load since 0.7.10 (a red-team finding: amfs_retrain and amfs_calibrate
    read every named version with its value, +1.9 GB for 100 values of 1 MiB, though they use only confidence,
    tiers and times)."""
    from amfs_server.ml.traces import OutcomeHistory

    with_values = await OutcomeHistory.load(mixed_history)
    bare = await OutcomeHistory.load(mixed_history, values=False)
    assert bare.versions.keys() == with_values.versions.keys() and bare.versions
    assert {v.value for v in bare.versions.values()} == {None}
    assert SECRET in {v.value for v in with_values.versions.values()}  # an export still gets the values
    assert all(e.value is None for e in await mixed_history.current_entries(values=False))


async def test_a_history_without_outcomes_reads_no_version(service: MemoryService) -> None:
    from amfs_server.ml.traces import OutcomeHistory

    actor = Actor("agent", "s1")
    await service.write(actor, WriteRequest("team-a", "x", "a fact"))
    await service.read(actor, "team-a", "x")
    history = await OutcomeHistory.load(service)
    assert history.events and not history.outcomes and history.versions == {}


# -- what a killed process leaves -----------------------------------------------------------------


@pytest.fixture
def mixed_ml(mixed_history: MemoryService, tmp_path: Path) -> MLService:
    return MLService(mixed_history, tmp_path / "exports")


async def _export_killed_between_its_renames(ml: MLService, monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """An sft export to `name` whose process is killed (a KeyboardInterrupt stands in) after the export's rename and
    before its sources file's."""
    real = os.replace

    def killed_at_the_sources(src: object, dst: object, **kwargs: object) -> None:
        if str(dst) == name + ".amfs-sources":
            raise KeyboardInterrupt("killed between the two renames")
        real(src, dst, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "replace", killed_at_the_sources)
    with pytest.raises(KeyboardInterrupt):
        await ml.export_training_data("sft", output_path=name)
    monkeypatch.undo()


def _holding_the_secret(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes())


async def test_an_export_killed_between_its_two_renames_is_deleted_by_the_next_scrub(
    mixed_ml: MLService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Red-team finding (0.7.13): killed after the export was renamed into place and before its sources file was,
    the export held a memory the scrub never found (no sources file beside it), so forgetting the memory left it."""
    await _export_killed_between_its_renames(mixed_ml, monkeypatch, "train.jsonl")
    assert _holding_the_secret(mixed_ml.export_dir) == ["train.jsonl"]  # and no sources file beside it
    assert (mixed_ml.export_dir / ".amfs-exports.pending").read_text() == "train.jsonl"
    from amfs_server.ml.export import scrub_exports

    await mixed_ml.service.forget("team-b", "secret")
    await scrub_exports(mixed_ml.service, mixed_ml.export_dir)  # as every front end runs after an erase
    assert _holding_the_secret(mixed_ml.export_dir) == []
    assert sorted(p.name for p in mixed_ml.export_dir.iterdir()) == [".amfs-exports.lock"]


async def test_files_a_killed_export_or_scrub_was_writing_go_at_the_next_scrub_and_one_being_written_stays(
    mixed_ml: MLService,
) -> None:
    from amfs_server.core.interprocess import hold_while_open
    from amfs_server.ml.export import scrub_exports

    folder = mixed_ml.export_dir / "key-aaaa"
    folder.mkdir(parents=True)
    left = [folder / "train.jsonl.partial", folder / "train.jsonl.amfs-sources.partial", folder / ".train.jsonl.77.scrub"]
    for path in left:
        path.write_text(f'{{"messages": ["{SECRET}"]}}\n')
    being_written = folder / "other.jsonl.partial"
    fd = os.open(being_written, os.O_WRONLY | os.O_CREAT)
    hold_while_open(fd)  # as a live export holds its partial file
    try:
        await scrub_exports(mixed_ml.service, mixed_ml.export_dir)
        assert not any(path.exists() for path in left) and being_written.exists()
    finally:
        os.close(fd)
    await scrub_exports(mixed_ml.service, mixed_ml.export_dir)
    assert not being_written.exists()  # its writer is gone


async def test_a_killed_exports_mark_survives_the_next_export_and_never_reaches_past_a_link(
    mixed_ml: MLService, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Review findings (0.7.13): the next export replaced a killed export's mark, so the cut export was never
    scrubbed; and a mark naming a path through a linked folder deleted files outside the export folder."""
    from amfs_server.ml.export import scrub_exports

    await _export_killed_between_its_renames(mixed_ml, monkeypatch, "x.jsonl")
    await mixed_ml.export_training_data("sft", output_path="y.jsonl")  # before any scrub
    await mixed_ml.service.forget("team-b", "secret")
    await scrub_exports(mixed_ml.service, mixed_ml.export_dir)
    assert _holding_the_secret(mixed_ml.export_dir) == []
    assert not (mixed_ml.export_dir / "x.jsonl").exists()

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "notes.txt").write_text("keep me")
    (mixed_ml.export_dir / "linked").symlink_to(outside)
    (mixed_ml.export_dir / ".amfs-exports.pending").write_text("linked/notes.txt")
    await scrub_exports(mixed_ml.service, mixed_ml.export_dir)
    assert (outside / "notes.txt").read_text() == "keep me"
    assert not (mixed_ml.export_dir / ".amfs-exports.pending").exists()


async def test_an_export_to_a_name_another_live_export_is_writing_is_refused_and_a_fifo_never_blocks_a_scrub(
    mixed_ml: MLService,
) -> None:
    from amfs_server.core.interprocess import hold_while_open
    from amfs_server.ml.export import scrub_exports

    mixed_ml.export_dir.mkdir(parents=True)
    busy = mixed_ml.export_dir / "train.jsonl.partial"
    fd = os.open(busy, os.O_WRONLY | os.O_CREAT)
    hold_while_open(fd)  # another export, writing
    try:
        with pytest.raises(ValidationError, match="being written right now"):
            await mixed_ml.export_training_data("sft", output_path="train.jsonl")
        assert busy.exists() and not (mixed_ml.export_dir / "train.jsonl").exists()
    finally:
        os.close(fd)
    os.mkfifo(mixed_ml.export_dir / "pipe.partial")
    await asyncio.wait_for(scrub_exports(mixed_ml.service, mixed_ml.export_dir), 10)  # opening a FIFO would block
    assert not busy.exists()  # its writer is gone
    result = await mixed_ml.export_training_data("sft", output_path="train.jsonl")
    assert result.num_examples >= 1
