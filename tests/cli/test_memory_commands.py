"""`amfs-server memory ...`: show, export, import (exact round trip, refusals), forget, clear."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from amfs_server import AgentMemory, OutcomeType
from amfs_server.server.cli import cli


@pytest.fixture
def env(tmp_path, monkeypatch) -> dict[str, str]:
    data_dir = tmp_path / "store"
    monkeypatch.setenv("AMFS_DATA_DIR", str(data_dir))
    monkeypatch.setenv("AMFS_EMBEDDER", "none")
    with AgentMemory(agent_id="agent/cli", data_dir=data_dir, embedder="none") as mem:
        mem.write("checkout-service", "retry-pattern", {"summary": "exponential backoff", "max": 5}, confidence=0.85)
        mem.write("checkout-service", "retry-pattern", {"summary": "jittered backoff", "max": 3}, confidence=0.9)
        mem.write("payments", "risk-double-charge", "idempotency keys on POST /charge", memory_type="belief")
        mem.read("checkout-service", "retry-pattern")
        mem.commit_outcome("INC-1042", OutcomeType.CRITICAL_FAILURE)
    return {"AMFS_DATA_DIR": str(data_dir), "AMFS_EMBEDDER": "none"}


def test_memory_show_lists_current_entries(env) -> None:
    result = CliRunner().invoke(cli, ["memory", "show"])
    assert result.exit_code == 0, result.output
    assert "checkout-service/retry-pattern v2 confidence=1.0350" in result.output
    assert "payments/risk-double-charge v1" in result.output


def test_memory_show_escapes_format_characters_that_would_rearrange_or_hide_text(env) -> None:
    """A right-to-left override or a zero-width space in a value was printed raw (red-team repro)."""
    from amfs_server import AgentMemory

    with AgentMemory(agent_id="agent/test", embedder="none") as mem:
        mem.write("svc", "bidi", "pay \u202eduolc\u202c now\u200b")
    shown = CliRunner().invoke(cli, ["memory", "show"]).output
    assert "\\u202eduolc\\u202c now\\u200b" in shown and "\u202e" not in shown and "\u200b" not in shown


@pytest.mark.parametrize("limit", ["0", "-5"])
def test_memory_show_refuses_a_limit_below_one(env, limit: str) -> None:
    result = CliRunner().invoke(cli, ["memory", "show", "--limit", limit])
    assert result.exit_code == 2 and "--limit" in result.output and "Traceback" not in result.output


def test_export_then_import_into_an_empty_store_round_trips_exactly(env, tmp_path, monkeypatch) -> None:
    runner = CliRunner()
    exported = runner.invoke(cli, ["memory", "export"])
    assert exported.exit_code == 0
    first = json.loads(exported.output)
    assert len(first["entries"]) == 3 and len(first["outcomes"]) == 1 and first["traces"]
    export_file = tmp_path / "backup.json"
    export_file.write_text(exported.output)

    monkeypatch.setenv("AMFS_DATA_DIR", str(tmp_path / "fresh"))
    imported = runner.invoke(cli, ["memory", "import", str(export_file)])
    assert imported.exit_code == 0, imported.output
    second = json.loads(runner.invoke(cli, ["memory", "export"]).output)
    for section in ("entries", "outcomes", "traces", "meta"):
        assert second[section] == first[section]


def _import_killed_after_its_memories(runner: CliRunner, tmp_path: Path, monkeypatch) -> tuple[dict, Path]:
    """The `env` store exported with one learned preference, then imported into a fresh data dir (the new
    AMFS_DATA_DIR) by a run killed after the memories were committed; returns the document and its file."""
    from amfs_server.core.learning import LearningService

    document = json.loads(runner.invoke(cli, ["memory", "export"]).output)
    document["extra"]["preferences"] = [{
        "user_id": "alice", "category": "code_formatting", "key": "line_length", "value": 100, "confidence": 0.9,
        "sample_size": 5, "support": 5, "source": "corrected", "updated_at": "2026-01-01T00:00:00Z", "sessions": 2,
    }]
    export_file = tmp_path / "backup.json"
    export_file.write_text(json.dumps(document))
    monkeypatch.setenv("AMFS_DATA_DIR", str(tmp_path / "fresh"))

    async def killed(*_: object) -> None:
        raise KeyboardInterrupt("killed after the memories were committed")

    with monkeypatch.context() as patch:
        patch.setattr(LearningService, "import_", killed)
        assert runner.invoke(cli, ["memory", "import", str(export_file)]).exit_code != 0
    return document, export_file


def test_an_import_stopped_after_its_memories_finishes_when_run_again(env, tmp_path, monkeypatch) -> None:
    """Red-team finding: killed between the memories (amfs.db) and the learned records (learning.db), the import
    could not be run again: the store already held its keys."""
    runner = CliRunner()
    document, export_file = _import_killed_after_its_memories(runner, tmp_path, monkeypatch)
    assert runner.invoke(cli, ["memory", "search", "backoff"]).exit_code == 0  # a read in between moves recall counts
    again = runner.invoke(cli, ["memory", "import", str(export_file)])
    assert again.exit_code == 0, again.output
    assert "already in" in again.output and "1 preferences" in again.output
    after = json.loads(runner.invoke(cli, ["memory", "export"]).output)
    assert [(e["entity_path"], e["key"], e["version"], e["value"]) for e in after["entries"]] == [
        (e["entity_path"], e["key"], e["version"], e["value"]) for e in document["entries"]]
    assert [p["key"] for p in after["extra"]["preferences"]] == ["line_length"]
    assert runner.invoke(cli, ["memory", "import", str(export_file)]).exit_code != 0  # a third time: all there


def test_an_import_stopped_after_its_memories_finishes_though_one_was_forgotten_since(env, tmp_path, monkeypatch) -> None:
    """Red-team finding (0.7.11): the rerun compared the store with the file and, one memory short, was refused as a
    store that already held the keys; the learned records could then only come with a clear and a full import,
    which brought the forgotten memory back."""
    runner = CliRunner()
    document, export_file = _import_killed_after_its_memories(runner, tmp_path, monkeypatch)
    assert runner.invoke(cli, ["memory", "forget", "payments/risk-double-charge"]).exit_code == 0
    again = runner.invoke(cli, ["memory", "import", str(export_file)])
    assert again.exit_code == 0, again.output
    assert "already in" in again.output and "1 preferences" in again.output
    after = json.loads(runner.invoke(cli, ["memory", "export"]).output)
    assert "risk-double-charge" not in {e["key"] for e in after["entries"]}  # forgotten, and not brought back
    assert "import_pending" not in after["meta"]
    assert [p["key"] for p in after["extra"]["preferences"]] == ["line_length"]
    assert runner.invoke(cli, ["memory", "import", str(export_file)]).exit_code != 0  # finished: refused again


def test_export_to_a_file(env, tmp_path) -> None:
    target = tmp_path / "out.json"
    result = CliRunner().invoke(cli, ["memory", "export", "-o", str(target)])
    assert result.exit_code == 0
    assert json.loads(target.read_text())["format"] == "amfs-export"


@pytest.mark.parametrize("name", ["amfs.db", "amfs.db-wal", "amfs.vectors.usearch", "amfs.vectors.lock",
                                  "amfs.vectors.json", "learning.db", "elsewhere.db"])
def test_export_and_reembed_refuse_to_write_over_a_store_file(env, tmp_path, name: str) -> None:
    store_dir = tmp_path / "store"
    target = store_dir / name if name != "elsewhere.db" else tmp_path / name
    if name == "elsewhere.db":  # another store's database, anywhere
        import sqlite3

        sqlite3.connect(target).execute("CREATE TABLE t (x)").connection.close()
    before = target.read_bytes() if target.exists() else None
    for command in (["memory", "export", "-o", str(target)], ["memory", "reembed", "--backup", str(target)]):
        result = CliRunner().invoke(cli, command)
        assert result.exit_code != 0
        assert "would damage the store" in result.output and "Traceback" not in result.output
        assert (target.read_bytes() if target.exists() else None) == before
    shown = CliRunner().invoke(cli, ["memory", "show"])
    assert shown.exit_code == 0 and "checkout-service/retry-pattern v2" in shown.output


def test_export_into_a_missing_folder_is_one_clear_line(env, tmp_path) -> None:
    result = CliRunner().invoke(cli, ["memory", "export", "-o", str(tmp_path / "no" / "such" / "x.json")])
    assert result.exit_code != 0
    assert "does not exist; create it or choose another path. Nothing was exported." in result.output
    assert "Traceback" not in result.output and not (tmp_path / "no").exists()


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ("not json", "not JSON"),
        ('{"format": "other"}', "invalid export"),
        ('{"format": "amfs-export", "version": 1, "exported_at": "2026-01-01T00:00:00Z", "entries": [{"entity_path": "a"}], '
         '"outcomes": [], "traces": [], "meta": {}}', "entries.0"),
    ],
)
def test_import_refuses_a_malformed_file_and_imports_nothing(env, tmp_path, monkeypatch, content, reason) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    monkeypatch.setenv("AMFS_DATA_DIR", str(tmp_path / "empty"))
    result = CliRunner().invoke(cli, ["memory", "import", str(bad)])
    assert result.exit_code != 0
    assert reason in result.output and "Nothing was imported" in result.output
    assert json.loads(CliRunner().invoke(cli, ["memory", "export"]).output)["entries"] == []


def test_import_refuses_an_invalid_entity_path(env, tmp_path, monkeypatch) -> None:
    document = json.loads(CliRunner().invoke(cli, ["memory", "export"]).output)
    document["entries"][0]["entity_path"] = "../etc"
    bad = tmp_path / "path.json"
    bad.write_text(json.dumps(document))
    monkeypatch.setenv("AMFS_DATA_DIR", str(tmp_path / "empty"))
    result = CliRunner().invoke(cli, ["memory", "import", str(bad)])
    assert result.exit_code != 0 and "relative segments" in result.output


def test_import_refuses_a_version_gap(env, tmp_path, monkeypatch) -> None:
    document = json.loads(CliRunner().invoke(cli, ["memory", "export"]).output)
    document["entries"] = [e for e in document["entries"] if not (e["key"] == "retry-pattern" and e["version"] == 1)]
    bad = tmp_path / "gap.json"
    bad.write_text(json.dumps(document))
    monkeypatch.setenv("AMFS_DATA_DIR", str(tmp_path / "empty"))
    result = CliRunner().invoke(cli, ["memory", "import", str(bad)])
    assert result.exit_code != 0 and "expected 1..1" in result.output


def test_import_into_a_store_that_holds_the_key_refuses_and_changes_nothing(env, tmp_path) -> None:
    export_file = tmp_path / "backup.json"
    CliRunner().invoke(cli, ["memory", "export", "-o", str(export_file)])
    before = json.loads(CliRunner().invoke(cli, ["memory", "export"]).output)
    result = CliRunner().invoke(cli, ["memory", "import", str(export_file)])
    assert result.exit_code != 0 and "refuses to overwrite" in result.output
    after = json.loads(CliRunner().invoke(cli, ["memory", "export"]).output)
    assert after["entries"] == before["entries"] and after["traces"] == before["traces"]


def test_forget_removes_every_version(env) -> None:
    result = CliRunner().invoke(cli, ["memory", "forget", "checkout-service/retry-pattern"])
    assert result.exit_code == 0 and "2 versions" in result.output
    assert "retry-pattern" not in CliRunner().invoke(cli, ["memory", "show"]).output
    missing = CliRunner().invoke(cli, ["memory", "forget", "checkout-service/retry-pattern"])
    assert missing.exit_code != 0 and "nothing was forgotten" in missing.output


def test_clear_asks_for_confirmation_unless_yes(env) -> None:
    declined = CliRunner().invoke(cli, ["memory", "clear"], input="n\n")
    assert declined.exit_code != 0
    assert "Memories (2)" in CliRunner().invoke(cli, ["memory", "show"]).output
    confirmed = CliRunner().invoke(cli, ["memory", "clear", "--yes"])
    assert confirmed.exit_code == 0
    assert "Memories (0)" in CliRunner().invoke(cli, ["memory", "show"]).output


@pytest.mark.parametrize(
    ("spelling", "reason"),
    [("Infinity", "Infinity is not a JSON number"), ("NaN", "NaN is not a JSON number"),
     ("-Infinity", "-Infinity is not a JSON number"), ("1e999", "1e999 overflows"), ("1e300", "less than or equal to 100")],
)
def test_import_refuses_non_finite_or_out_of_range_confidence(env, tmp_path, monkeypatch, spelling, reason) -> None:
    text = CliRunner().invoke(cli, ["memory", "export"]).output
    document = json.loads(text)
    document["entries"][0]["confidence"] = "__CONFIDENCE__"
    bad = tmp_path / "nonfinite.json"
    bad.write_text(json.dumps(document).replace('"__CONFIDENCE__"', spelling))
    monkeypatch.setenv("AMFS_DATA_DIR", str(tmp_path / "empty"))
    result = CliRunner().invoke(cli, ["memory", "import", str(bad)])
    assert result.exit_code != 0 and reason in result.output and "Nothing was imported" in result.output
    assert json.loads(CliRunner().invoke(cli, ["memory", "export"]).output)["entries"] == []


def test_export_of_a_store_left_with_infinite_confidence_is_standard_json(env, tmp_path) -> None:
    import sqlite3

    with sqlite3.connect(tmp_path / "store" / "amfs.db") as conn:
        conn.execute("UPDATE entries SET confidence = 9e999")
        conn.execute("UPDATE outcome_effects SET confidence_before = 9e999, confidence_after = 9e999")
    text = CliRunner().invoke(cli, ["memory", "export"]).output
    assert "Infinity" not in text
    json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in export"))


@pytest.fixture
def embedded(tmp_path, monkeypatch) -> dict:
    """A store written with the real default embedder: a two-sentence memory has sentence embeddings."""
    data_dir = tmp_path / "embedded"
    monkeypatch.setenv("AMFS_DATA_DIR", str(data_dir))
    monkeypatch.delenv("AMFS_EMBEDDER", raising=False)
    with AgentMemory(agent_id="agent/cli", data_dir=data_dir) as mem:
        mem.write("chat/c1", "t1", "Jonah: Ugh, Mondays. Meet Taco, my new Maine Coon kitten!")
        mem.write("svc/payments", "timeout", "gateway timeout is 30 seconds")
    return json.loads(CliRunner().invoke(cli, ["memory", "export"]).output)


def test_sentence_embeddings_are_exported_as_float32_base64_and_imported_exactly(embedded, tmp_path, monkeypatch):
    import base64

    import numpy as np

    turn, note = embedded["entries"]
    width = len(turn["embedding"])  # the default embedder's (768 since 0.7.0)
    rows = np.frombuffer(base64.b64decode(turn["passage_embeddings"]), dtype="<f4").reshape(-1, width)
    assert width == 768 and rows.shape == (2, width) and np.allclose(np.linalg.norm(rows, axis=1), 1.0, atol=1e-5)
    assert note["passage_embeddings"] is None  # one sentence: its embedding is the entry vector
    export_file = tmp_path / "backup.json"
    export_file.write_text(json.dumps(embedded))
    monkeypatch.setenv("AMFS_DATA_DIR", str(tmp_path / "fresh"))
    imported = CliRunner().invoke(cli, ["memory", "import", str(export_file)])
    assert imported.exit_code == 0, imported.output
    again = json.loads(CliRunner().invoke(cli, ["memory", "export"]).output)
    assert again["entries"] == embedded["entries"]  # byte for byte: float32 in, float32 out


@pytest.mark.parametrize(("spoil", "reason"), [
    (lambda text: "not base64!", "not base64"),
    (lambda text: text[:-8], "not whole float32 rows"),
])
def test_import_refuses_broken_sentence_embeddings_and_imports_nothing(embedded, tmp_path, monkeypatch, spoil, reason):
    embedded["entries"][0]["passage_embeddings"] = spoil(embedded["entries"][0]["passage_embeddings"])
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(embedded))
    monkeypatch.setenv("AMFS_DATA_DIR", str(tmp_path / "empty"))
    result = CliRunner().invoke(cli, ["memory", "import", str(bad)])
    assert result.exit_code != 0 and reason in result.output and "entries.0.passage_embeddings" in result.output
    assert json.loads(CliRunner().invoke(cli, ["memory", "export"]).output)["entries"] == []


def _import(tmp_path, document: dict, name: str = "hostile.json"):
    path = tmp_path / name
    path.write_text(json.dumps(document) if isinstance(document, dict) else document)
    return CliRunner().invoke(cli, ["memory", "import", str(path)])


def _export() -> dict:
    return json.loads(CliRunner().invoke(cli, ["memory", "export"]).output)


@pytest.mark.parametrize(
    ("spoil", "reason"),
    [
        (lambda d: d["entries"][0].update(outcome_count=10**30), "entries.0.outcome_count"),  # was an OverflowError
        (lambda d: d["traces"][0].update(version=2**70), "traces.0.version"),
        (lambda d: d["traces"][0].update(entity_path="../../etc"), "relative segments"),
        (lambda d: d["meta"].update(outcome_multipliers={"success": -5}), "outcome_multipliers"),  # bricked the store
        (lambda d: d["meta"].update(outcome_multipliers="garbage"), "outcome_multipliers"),
        (lambda d: d["extra"].setdefault("preferences", []).append({
            "user_id": "u", "category": "code_formatting", "key": "style", "value": "black", "confidence": 0.5,
            "sample_size": 10**30, "support": 1, "source": "learned", "updated_at": "2026-01-01T00:00:00Z"}),
         "sample_size"),  # was an OverflowError after the entries had been written
        # what amfs_commit_outcome refuses or changes: two records for one incident once imported
        (lambda d: d["outcomes"][0].update(outcome_ref="INC-1042\u200b"), "not a ref amfs_commit_outcome accepts"),
        (lambda d: d["outcomes"][0].update(outcome_ref="INC-1042 "), "not a ref amfs_commit_outcome accepts"),
        # what a write refuses, an import took (red-team repros, 0.7.14)
        (lambda d: d["entries"][0].update(confidence="0.9"), "entries.0.confidence"),
        (lambda d: d["entries"][0].update(version=True), "entries.0.version"),
        (lambda d: d["outcomes"][0]["effects"][0].update(confidence_after=1e308), "confidence_after"),
        (lambda d: d["outcomes"][0].update(multiplier=-1e308), "multiplier"),
        (lambda d: d["entries"][0].update(value="x" * 1_100_000), "the limit is 1048576"),
        (lambda d: d["entries"][0].update(embedding=["0.5", "0.5", "0.5"]), "entries.0.embedding"),  # a TypeError
        (lambda d: d["entries"][0].update(embedding=[True, True, True]), "entries.0.embedding"),
        (lambda d: d["entries"][0].update(importance_dimensions={"impact": "0.5"}), "importance_dimensions"),
        # SQLite took a 10-dimension vector beside 384-dimension ones (PostgreSQL refused it)
        (lambda d: (d["entries"][0].update(embedding=[0.5] * 10), d["entries"][1].update(embedding=[0.05] * 384)),
         "dimensions"),
    ],
)
def test_a_hostile_import_is_refused_with_the_reason_and_leaves_the_store_usable(env, tmp_path, monkeypatch, spoil, reason):
    document = _export()
    spoil(document)
    monkeypatch.setenv("AMFS_DATA_DIR", str(tmp_path / "target"))
    result = _import(tmp_path, document)
    assert result.exit_code == 1 and reason in result.output and "Traceback" not in result.output, result.output
    after = _export()  # the store still opens, and holds nothing of the refused file
    assert after["entries"] == [] and after["outcomes"] == [] and "outcome_multipliers" not in after["meta"]
    assert CliRunner().invoke(cli, ["memory", "show"]).exit_code == 0


def test_an_import_of_unreadable_text_numbers_or_vectors_is_refused_with_the_reason(env, tmp_path, monkeypatch) -> None:
    """Each ended in a traceback (not UTF-8, an integer of 5,000 digits, a lone surrogate); a vector number beyond
    float32 imported into SQLite as infinity, after which export, search and re-embed of the store failed; a FIFO
    was read forever (red-team repros)."""
    import os

    document = _export()
    monkeypatch.setenv("AMFS_DATA_DIR", str(tmp_path / "target"))
    text = json.dumps(document)
    cases = {
        "latin1.json": (text.encode().replace(b"checkout", b"checko\xfct", 1), "not UTF-8 text"),  # one Latin-1 byte
        "digits.json": (text.replace('"outcome_count": 0', '"outcome_count": ' + "9" * 5000, 1).encode(),
                        "a number that cannot be read"),
        "surrogate.json": (text.replace("checkout", "\\ud800checkout", 1).encode(), "a lone surrogate"),
    }
    vector = json.loads(text)
    vector["entries"][0]["embedding"] = [1e39] * 3
    cases["vector.json"] = (json.dumps(vector).encode(), "beyond float32's range")
    for name, (content, reason) in cases.items():
        (tmp_path / name).write_bytes(content)
        result = CliRunner().invoke(cli, ["memory", "import", str(tmp_path / name)])
        assert result.exit_code == 1 and reason in result.output and "Nothing was imported" in result.output, name
        assert "Traceback" not in result.output
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    result = CliRunner().invoke(cli, ["memory", "import", str(fifo)])
    assert result.exit_code == 1 and "not a regular file" in result.output
    assert _export()["entries"] == []


def test_an_import_naming_a_key_twice_in_one_object_is_refused(env, tmp_path, monkeypatch) -> None:
    """JSON keeps the last of two equal keys silently: the file imported with whichever value came second."""
    text = json.dumps(_export()).replace('"key": ', '"key": "shadow", "key": ', 1)
    monkeypatch.setenv("AMFS_DATA_DIR", str(tmp_path / "target"))
    result = _import(tmp_path, text)
    assert result.exit_code == 1 and "names the key 'key' twice" in result.output and _export()["entries"] == []


def test_an_import_nested_too_deeply_is_refused_with_the_reason(env, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("AMFS_DATA_DIR", str(tmp_path / "target"))
    result = _import(tmp_path, "[" * 100_000 + "]" * 100_000)
    assert result.exit_code == 1 and "nested too deeply" in result.output and "Traceback" not in result.output


def test_an_import_adds_to_a_store_but_never_overwrites_its_settings(env, tmp_path) -> None:
    """A file with no entries and `meta.embedder` used to replace the store's record (and lock the server out)."""
    from amfs_server.server.settings import load_settings
    from amfs_server.server.composition import build_service
    import asyncio

    async def set_meta(name, value):
        service = build_service(load_settings({}, data_dir=env["AMFS_DATA_DIR"], embedder="none"))
        await service.open()
        await service.store.set_meta(name, value)
        await service.close()

    asyncio.run(set_meta("embedder", "all-MiniLM-L6-v2-onnx-int8"))
    before = _export()
    document = {**before, "entries": [], "outcomes": [], "traces": [], "extra": {},
                "meta": {"embedder": "evil-embedder", "ranker_models": {"x": 1}}}
    result = _import(tmp_path, document)
    assert result.exit_code == 0, result.output
    after = _export()
    assert after["meta"]["embedder"] == "all-MiniLM-L6-v2-onnx-int8"  # the store's own, kept
    assert after["meta"]["ranker_models"] == {"x": 1}  # what the store did not hold is added


def test_memory_forget_takes_the_memory_out_of_the_training_exports_in_the_data_dir(env, tmp_path) -> None:
    """As amfs_forget does (tests/ml/test_ml_tools.py): an example made from a forgotten version leaves the
    export files under <data dir>/ml/exports; the others stay."""
    exports = tmp_path / "store" / "ml" / "exports" / "team"
    exports.mkdir(parents=True)
    doomed = {"messages": ["checkout-service/retry-pattern (v2): jittered backoff"]}
    kept = {"messages": ["payments/risk-double-charge (v1): idempotency keys"]}
    export = exports / "sft.jsonl"
    export.write_text(json.dumps(doomed) + "\n" + json.dumps(kept) + "\n")
    sources = exports / "sft.jsonl.amfs-sources"
    sources.write_text('[["checkout-service/retry-pattern", 2], ["payments/risk-double-charge", 1]]\n'
                       '[["payments/risk-double-charge", 1]]\n')
    result = CliRunner().invoke(cli, ["memory", "forget", "checkout-service/retry-pattern"])
    assert result.exit_code == 0, result.output
    assert export.read_text() == json.dumps(kept) + "\n"
    assert sources.read_text() == '[["payments/risk-double-charge", 1]]\n'
