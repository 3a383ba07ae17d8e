"""The learned ranker: minimum-data refusal, metrics, persistence, and its place in retrieval fusion."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from amfs_server.core.ports import StoreSnapshot
from amfs_server.core.errors import InsufficientDataError
from amfs_server.core.models import Actor
from amfs_server.core.retrieval import LEARNED_WEIGHT
from amfs_server.core.service import MemoryService
from amfs_server.ml import FEATURE_NAMES, LearnedRanker, load_installed_models
from amfs_server.ml.ranker import model_slug

ACTOR = Actor("agent/test", "ranker-test")


async def test_training_below_20_outcome_linked_samples_is_refused_and_retrieval_keeps_fixed_fusion(
    sqlite_service: MemoryService, short_history: StoreSnapshot, tmp_path: Path
) -> None:
    await sqlite_service.import_snapshot(short_history)
    ranker = LearnedRanker(sqlite_service, tmp_path / "models")
    with pytest.raises(InsufficientDataError, match=r"at least 20 outcome-linked samples.*found 1?\d from 3 outcomes"):
        await ranker.train()
    assert sqlite_service.learned_scorer is None
    assert sqlite_service.retrieval_weights()["learned"] == 0.0
    assert not (tmp_path / "models").exists()


async def test_training_on_simulated_history_returns_the_documented_metrics_and_persists_lightgbm_text(
    sim_service: MemoryService, tmp_path: Path
) -> None:
    ranker = LearnedRanker(sim_service, tmp_path / "models")
    metrics = (await ranker.train()).to_dict()
    assert {"num_samples", "num_positive", "num_negative", "accuracy", "feature_importances", "trained_at"} <= set(metrics)
    assert metrics["num_samples"] == metrics["num_positive"] + metrics["num_negative"]
    assert metrics["num_outcome_linked"] >= 100 and metrics["num_never_linked"] > 0
    assert 0.0 <= metrics["accuracy"] <= 1.0 and metrics["num_holdout"] > 0
    assert set(metrics["feature_importances"]) <= set(FEATURE_NAMES)
    assert sum(metrics["feature_importances"].values()) == pytest.approx(1.0, abs=0.01)
    assert metrics["trained_at"].endswith("Z")
    model_text = (tmp_path / "models" / "ranker-global.txt").read_text()
    assert model_text.startswith("tree\n")  # LightGBM's own text format, not a pickle
    saved = json.loads((tmp_path / "models" / "ranker-global.json").read_text())
    assert saved["feature_names"] == list(FEATURE_NAMES) and saved["metrics"]["num_samples"] == metrics["num_samples"]


async def test_a_saved_model_loaded_by_a_fresh_ranker_gives_identical_scores(sim_sqlite: MemoryService, tmp_path: Path) -> None:
    trained = LearnedRanker(sim_sqlite, tmp_path / "models")
    await trained.train()
    results = await sim_sqlite.retrieve(ACTOR, "payments retry checkout cache", limit=20, explain=True)
    entries = [r.entry for r in results]
    ranks = {r.entry.entry_key: {name: hit.rank for name, hit in (r.strategies or {}).items()} for r in results}

    reloaded = LearnedRanker(sim_sqlite.store, tmp_path / "models")
    assert [m.num_samples for m in reloaded.load()] == [trained.metrics().num_samples]  # type: ignore[union-attr]
    assert reloaded.score(entries, ranks) == trained.score(entries, ranks)
    assert len(set(trained.score(entries, ranks))) > 1


async def test_a_trained_model_gets_30_percent_of_fusion_and_without_one_retrieval_is_unchanged(
    sim_sqlite: MemoryService, tmp_path: Path
) -> None:
    query = "payments retry"
    empty = LearnedRanker(sim_sqlite, tmp_path / "none")
    assert empty.load() == [] and empty.install() is False
    assert sim_sqlite.learned_scorer is None
    before = await sim_sqlite.retrieve(ACTOR, query, limit=10, explain=True)
    assert all("learned" not in (r.strategies or {}) for r in before)

    ranker = LearnedRanker(sim_sqlite, tmp_path / "models")
    await ranker.train()  # trained on a service: installs itself
    assert sim_sqlite.learned_scorer is not None
    weights = sim_sqlite.retrieval_weights()
    assert weights["learned"] == pytest.approx(LEARNED_WEIGHT) and sum(weights.values()) == pytest.approx(1.0)
    after = await sim_sqlite.retrieve(ACTOR, query, limit=10, explain=True)
    assert any("learned" in (r.strategies or {}) for r in after)

    sim_sqlite.learned_scorer = None  # what a missing model means: the same fusion as before training
    again = await sim_sqlite.retrieve(ACTOR, query, limit=10, weights=None)
    assert [r.entry.entry_key for r in again] == [r.entry.entry_key for r in before]


async def test_load_installed_models_serves_persisted_models_at_start_up(sim_sqlite: MemoryService, tmp_path: Path) -> None:
    await LearnedRanker(sim_sqlite.store, tmp_path / "models").train()  # a bare store: trains, does not install
    assert sim_sqlite.learned_scorer is None
    ranker = load_installed_models(sim_sqlite, tmp_path / "models")
    assert ranker.trained and sim_sqlite.learned_scorer is not None


async def test_a_per_entity_model_is_saved_beside_the_global_one_and_scores_its_entity(
    sim_sqlite: MemoryService, tmp_path: Path
) -> None:
    ranker = LearnedRanker(sim_sqlite, tmp_path / "models")
    metrics = await ranker.train(entity_path="svc-0")
    assert metrics.entity_path == "svc-0"
    assert (tmp_path / "models" / f"ranker-{model_slug('svc-0')}.txt").exists()
    assert not (tmp_path / "models" / "ranker-global.txt").exists()
    results = await sim_sqlite.retrieve(ACTOR, "payments retry cache eviction", limit=20, explain=True)
    scores = dict(zip((r.entry.entry_key for r in results), ranker.score([r.entry for r in results], {})))
    # Entities without a model of their own (and no global one) get the neutral score.
    assert {s for k, s in scores.items() if not k.startswith("svc-0/")} <= {0.5}
    assert any(s != 0.5 for k, s in scores.items() if k.startswith("svc-0/"))


async def test_models_trained_on_other_features_are_not_loaded(sim_sqlite: MemoryService, tmp_path: Path) -> None:
    await LearnedRanker(sim_sqlite, tmp_path / "models").train()
    meta_path = tmp_path / "models" / "ranker-global.json"
    meta = json.loads(meta_path.read_text())
    meta["feature_names"] = meta["feature_names"][:-1]
    meta_path.write_text(json.dumps(meta))
    assert LearnedRanker(sim_sqlite, tmp_path / "models").load() == []


async def test_start_up_without_a_trained_model_does_not_import_lightgbm(sim_sqlite: MemoryService, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "lightgbm", None)  # any import of it would raise
    assert load_installed_models(sim_sqlite, tmp_path / "models").trained is False


async def test_persisted_models_without_lightgbm_are_not_served_and_the_log_says_how_to_install_it(
    sim_sqlite: MemoryService, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    await LearnedRanker(sim_sqlite.store, tmp_path / "models").train()
    monkeypatch.setitem(sys.modules, "lightgbm", None)
    ranker = load_installed_models(sim_sqlite, tmp_path / "models")
    assert not ranker.trained and sim_sqlite.learned_scorer is None
    assert "pip install 'amfs-server[ml]'" in caplog.text
