"""The learned ranker: minimum-data refusal, metrics, persistence, and its place in retrieval fusion."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from amfs_server.core.ports import StoreSnapshot
from amfs_server.core.errors import InsufficientDataError
from amfs_server.core.models import Actor
from amfs_server.core.retrieval import LEARNED_WEIGHT
from amfs_server.core.service import MemoryService
from amfs_server.ml import FEATURE_NAMES, LearnedRanker, load_installed_models
from amfs_server.ml.shared import ML_VERSION, RANKER_MODELS

ACTOR = Actor("agent/test", "ranker-test")


async def test_training_below_20_outcome_linked_samples_is_refused_and_retrieval_keeps_fixed_fusion(
    sqlite_service: MemoryService, short_history: StoreSnapshot, tmp_path: Path
) -> None:
    await sqlite_service.import_snapshot(short_history)
    ranker = LearnedRanker(sqlite_service)
    with pytest.raises(InsufficientDataError, match=r"at least 20 outcome-linked samples.*found 1?\d from 3 outcomes"):
        await ranker.train()
    assert sqlite_service.learned_scorer is None
    assert sqlite_service.retrieval_weights()["learned"] == 0.0
    assert await sqlite_service.get_shared_state(RANKER_MODELS) is None


async def test_one_outcome_blaming_many_entries_is_too_few_outcomes_to_train_on(sqlite_service: MemoryService) -> None:
    """Samples count entries read: one incident blaming 24 entries made 24 samples, and a model trained on it took
    30% of every retrieval, its held-out figures drawn from that same incident (red-team repro)."""
    from amfs_server.core.models import Actor
    from amfs_server.core.service import WriteRequest

    actor = Actor("agent/x", "s1")
    for n in range(24):
        await sqlite_service.write(actor, WriteRequest("changelog", f"c{n}", f"change {n}"))
    await sqlite_service.write(actor, WriteRequest("owners", "billing", "Billing is owned by Ana."))
    await sqlite_service.commit_outcome(actor, "deploy-1", "success",
                                        causal_entry_keys=[f"changelog/c{n}" for n in range(24)])
    with pytest.raises(InsufficientDataError, match=r"at least 5 committed outcomes; found 24 samples from 1,"):
        await LearnedRanker(sqlite_service).train()
    assert sqlite_service.learned_scorer is None and await sqlite_service.get_shared_state(RANKER_MODELS) is None


async def test_training_on_simulated_history_returns_the_documented_metrics_and_stores_lightgbm_text_in_the_store(
    sim_service: MemoryService,
) -> None:
    ranker = LearnedRanker(sim_service)
    metrics = (await ranker.train()).to_dict()
    assert {"num_samples", "num_positive", "num_negative", "accuracy", "feature_importances", "trained_at"} <= set(metrics)
    assert metrics["num_samples"] == metrics["num_positive"] + metrics["num_negative"]
    assert metrics["num_outcome_linked"] >= 100 and metrics["num_never_linked"] > 0
    assert 0.0 <= metrics["accuracy"] <= 1.0 and metrics["num_holdout"] > 0
    assert set(metrics["feature_importances"]) <= set(FEATURE_NAMES)
    assert sum(metrics["feature_importances"].values()) == pytest.approx(1.0, abs=0.01)
    assert metrics["trained_at"].endswith("Z")
    saved = await sim_service.get_shared_state(RANKER_MODELS)
    assert saved["models"][""]["model"].startswith("tree\n")  # LightGBM's own text format, not a pickle
    assert saved["feature_names"] == list(FEATURE_NAMES)
    assert saved["models"][""]["metrics"]["num_samples"] == metrics["num_samples"]
    assert (await sim_service.get_shared_state(ML_VERSION))["ranker"]  # what other processes watch


async def test_a_saved_model_loaded_by_a_fresh_ranker_gives_identical_scores(sim_sqlite: MemoryService) -> None:
    trained = LearnedRanker(sim_sqlite)
    await trained.train()
    results = await sim_sqlite.retrieve(ACTOR, "payments retry checkout cache", limit=20, explain=True)
    entries = [r.entry for r in results]
    ranks = {r.entry.entry_key: {name: hit.rank for name, hit in (r.strategies or {}).items()} for r in results}

    reloaded = LearnedRanker(sim_sqlite.store)
    assert [m.num_samples for m in await reloaded.load()] == [trained.metrics().num_samples]  # type: ignore[union-attr]
    assert reloaded.score(entries, ranks) == trained.score(entries, ranks)
    assert len(set(trained.score(entries, ranks))) > 1


async def test_a_trained_model_gets_30_percent_of_fusion_and_without_one_retrieval_is_unchanged(
    sim_sqlite: MemoryService,
) -> None:
    query = "payments retry"
    empty = LearnedRanker(sim_sqlite)
    assert await empty.load() == [] and empty.install() is False
    assert sim_sqlite.learned_scorer is None
    before = await sim_sqlite.retrieve(ACTOR, query, limit=10, explain=True)
    assert all("learned" not in (r.strategies or {}) for r in before)

    ranker = LearnedRanker(sim_sqlite)
    await ranker.train()  # trained on a service: installs itself
    assert sim_sqlite.learned_scorer is not None
    weights = sim_sqlite.retrieval_weights()
    assert weights["learned"] == pytest.approx(LEARNED_WEIGHT) and sum(weights.values()) == pytest.approx(1.0)
    after = await sim_sqlite.retrieve(ACTOR, query, limit=10, explain=True)
    assert any("learned" in (r.strategies or {}) for r in after)

    sim_sqlite.install_learned_scorer(None)  # what a missing model means: the same fusion as before training
    again = await sim_sqlite.retrieve(ACTOR, query, limit=10, weights=None)
    assert [r.entry.entry_key for r in again] == [r.entry.entry_key for r in before]


async def test_load_installed_models_serves_persisted_models_at_start_up(sim_sqlite: MemoryService) -> None:
    await LearnedRanker(sim_sqlite.store).train()  # a bare store: trains, does not install
    assert sim_sqlite.learned_scorer is None
    ranker = await load_installed_models(sim_sqlite)
    assert ranker.trained and sim_sqlite.learned_scorer is not None


async def test_two_processes_training_two_scopes_at_once_keep_both_models(sim_sqlite: MemoryService, monkeypatch) -> None:
    """Each save read the models record, added its model and wrote the record back: the later writer dropped the
    other's model. The record and its version mark are now one locked update (MemoryStore.update_meta, whose
    contract test races two handles)."""
    from amfs_server.adapters.sqlite import SQLiteStore

    other = MemoryService(SQLiteStore(sim_sqlite.store.path))  # a second process's handle on the same file
    await other.open()
    written: list[str] = []
    for service in (sim_sqlite, other):
        set_meta = service.store.set_meta
        monkeypatch.setattr(service.store, "set_meta", lambda name, value, set_meta=set_meta: (
            written.append(name), set_meta(name, value))[1])
    try:
        await asyncio.gather(LearnedRanker(sim_sqlite).train(entity_path="svc-0"),
                             LearnedRanker(other).train(entity_path="svc-1"))
    finally:
        await other.close()
    assert set((await sim_sqlite.get_shared_state(RANKER_MODELS))["models"]) == {"svc-0", "svc-1"}
    assert not {RANKER_MODELS, ML_VERSION} & set(written)  # never written apart from each other


async def test_a_per_entity_model_is_saved_beside_the_global_one_and_scores_its_entity(
    sim_sqlite: MemoryService,
) -> None:
    ranker = LearnedRanker(sim_sqlite)
    metrics = await ranker.train(entity_path="svc-0")
    assert metrics.entity_path == "svc-0"
    assert set((await sim_sqlite.get_shared_state(RANKER_MODELS))["models"]) == {"svc-0"}
    results = await sim_sqlite.retrieve(ACTOR, "payments retry cache eviction", entity_path="svc-0", limit=20)
    entries = [r.entry for r in results]
    assert len(set(ranker.score(entries, {}, "svc-0"))) > 1  # a retrieval filtered to svc-0: its model scores
    # Any other retrieval (the whole store, another entity) has no model while no whole-store one exists.
    assert set(ranker.score(entries, {}, None)) == set(ranker.score(entries, {}, "svc-1")) == {0.5}


async def test_a_per_entity_model_changes_only_the_retrievals_of_its_entity(sim_sqlite: MemoryService) -> None:
    """A key limited to svc-0 may train svc-0's model; nobody else's ranking (or weights) may move for it."""
    query = "payments retry cache eviction"
    before = {scope: await sim_sqlite.retrieve(ACTOR, query, entity_path=scope, limit=10, count_as_read=False)
              for scope in (None, "svc-1")}
    ranker = LearnedRanker(sim_sqlite)
    await ranker.train(entity_path="svc-0")
    for scope in (None, "svc-1", "svc-01"):
        assert not sim_sqlite.learned_applies(scope) and sim_sqlite.retrieval_weights(scope)["learned"] == 0.0
    for scope in ("svc-0", "svc-0/sub"):
        assert sim_sqlite.learned_applies(scope)
        assert sim_sqlite.retrieval_weights(scope)["learned"] == pytest.approx(LEARNED_WEIGHT)
    for scope, results in before.items():
        after = await sim_sqlite.retrieve(ACTOR, query, entity_path=scope, limit=10, count_as_read=False)
        assert [(r.entry.entry_key, r.score) for r in after] == [(r.entry.entry_key, r.score) for r in results]
    mine = await sim_sqlite.retrieve(ACTOR, query, entity_path="svc-0", limit=10, explain=True, count_as_read=False)
    assert all("learned" in (r.strategies or {}) for r in mine)
    await ranker.train()  # a whole-store model covers every retrieval
    assert sim_sqlite.learned_applies(None) and sim_sqlite.learned_applies("svc-1")


async def test_beside_a_whole_store_model_an_entitys_model_moves_no_whole_store_retrieval(
    sim_sqlite: MemoryService,
) -> None:
    """With a whole-store model in place, a team's own retrain re-scored that team's entries inside every unscoped
    retrieval (each entry took its own entity's model), so other teams' results moved (red-team repro: team-b's
    first result fell to sixth). A retrieval is scored by one model: the filter's, else the whole store's."""
    query = "payments retry cache eviction"
    ranker = LearnedRanker(sim_sqlite)
    await ranker.train()
    before = {scope: await sim_sqlite.retrieve(ACTOR, query, entity_path=scope, limit=10, count_as_read=False)
              for scope in (None, "svc-1")}
    await ranker.train(entity_path="svc-0")
    for scope, results in before.items():
        after = await sim_sqlite.retrieve(ACTOR, query, entity_path=scope, limit=10, count_as_read=False)
        assert [(r.entry.entry_key, r.score) for r in after] == [(r.entry.entry_key, r.score) for r in results], scope
    entries = [r.entry for r in before[None]]
    assert ranker.score(entries, {}, "svc-0") != ranker.score(entries, {}, None)  # svc-0's own retrievals: its model


async def test_models_trained_on_other_features_are_not_loaded(sim_sqlite: MemoryService) -> None:
    await LearnedRanker(sim_sqlite).train()
    state = await sim_sqlite.get_shared_state(RANKER_MODELS)
    await sim_sqlite.update_shared_state([RANKER_MODELS], lambda _: {
        RANKER_MODELS: {**state, "feature_names": state["feature_names"][:-1]}})
    assert await LearnedRanker(sim_sqlite).load() == []


async def test_an_unreadable_stored_model_is_skipped_and_the_others_still_serve(sim_sqlite: MemoryService) -> None:
    ranker = LearnedRanker(sim_sqlite)
    await ranker.train()
    await ranker.train(entity_path="svc-0")
    state = await sim_sqlite.get_shared_state(RANKER_MODELS)
    state["models"]["svc-0"]["model"] = "not a LightGBM model"
    await sim_sqlite.update_shared_state([RANKER_MODELS], lambda _: {RANKER_MODELS: state})
    assert [m.entity_path for m in await LearnedRanker(sim_sqlite).load()] == [None]


async def test_start_up_without_a_trained_model_does_not_import_lightgbm(
    sim_sqlite: MemoryService, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "lightgbm", None)  # any import of it would raise
    assert (await load_installed_models(sim_sqlite)).trained is False


async def test_stored_models_without_lightgbm_are_not_served_and_the_log_says_how_to_install_it(
    sim_sqlite: MemoryService, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    await LearnedRanker(sim_sqlite).train()
    sim_sqlite.install_learned_scorer(None)
    monkeypatch.setitem(sys.modules, "lightgbm", None)
    ranker = await load_installed_models(sim_sqlite)
    assert not ranker.trained and sim_sqlite.learned_scorer is None
    assert "pip install '.[ml]' (in the amfs-server checkout)" in caplog.text


def test_the_held_out_part_takes_whole_outcomes_newest_first() -> None:
    """A cut by sample put one outcome's samples on both sides of it, so the held-out figures were partly seen in
    training (README's "still open" until 0.7.15)."""
    import numpy as np

    from amfs_server.ml.ranker import _newest

    # Samples in read order; outcomes a (oldest) .. d (newest); e's samples were read early but it came last.
    outcome_of = [(1.0, "a")] * 4 + [(5.0, "e")] * 2 + [(2.0, "b")] * 4 + [(3.0, "c")] * 3 + [(4.0, "d")] * 3 + [None] * 5
    linked = np.array([o is not None for o in outcome_of])
    held = _newest(linked, np.ones(len(outcome_of), dtype=bool), outcome_of)
    held_outcomes = {outcome_of[i] for i in np.flatnonzero(held & linked)}
    assert held_outcomes == {(5.0, "e"), (4.0, "d")}  # 16 linked: 3 wanted, so e (2) and then d (3), each whole
    for outcome in {o for o in outcome_of if o is not None}:
        sides = {bool(held[i]) for i, o in enumerate(outcome_of) if o == outcome}
        assert len(sides) == 1, outcome
    assert list(np.flatnonzero(held & ~linked)) == [16]  # every 5th never-linked one
