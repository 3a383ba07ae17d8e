"""Hybrid retrieval: each strategy and the fusion on small fixtures with known answers, filters, depth, explain."""

from __future__ import annotations

from datetime import timedelta

import pytest

from amfs_server.core.errors import ValidationError
from amfs_server.core.models import Actor, EntryFilter, ValueHead, utcnow
from amfs_server.core.retrieval import (
    KEYWORD_LENGTH_PIVOT, RankedList, distinct_words, fuse, fuse_hybrid, keyword_length_factor, keyword_terms,
    names_an_identifier, near_copies, normalised, resolve_weights,
)
from amfs_server.core.service import MemoryService, ServiceConfig, WriteRequest

NOTES = [
    ("payments", "retry-pattern", "Failed card charges are retried with exponential backoff, at most 5 attempts."),
    ("auth-service", "decision-token-format", "Service-to-service tokens are JWTs signed with RS256, rotated weekly."),
    ("infra/k8s", "risk-oom", "Pods get OOMKilled when MAX_POOL_SIZE is above 50 connections."),
    ("web/frontend", "pattern-feature-flags", "New UI features ship behind LaunchDarkly flags, default off."),
    ("data/etl", "task-summary-backfill", "Backfilled the orders table for March after the ERR_LEDGER_409 outage."),
]


@pytest.fixture(scope="module")
def embedder():
    from amfs_server.adapters.embedders import load_embedder

    # chat-MiniLM-L6 (384 dimensions, the [postgres] fixture's width): these test the strategies, not the model
    return load_embedder("chat-minilm")


@pytest.fixture
async def rsvc(store, embedder) -> MemoryService:
    svc = MemoryService(store, ServiceConfig(), embedder=embedder)
    await svc.open()
    return svc


async def _seed(svc: MemoryService, actor: Actor) -> None:
    await svc.write_many(actor, [WriteRequest(path, key, text) for path, key, text in NOTES])


def test_keyword_terms_drop_stop_words_and_keep_identifiers() -> None:
    assert keyword_terms("What is the MAX_POOL_SIZE for the k8s pods?") == ["max_pool_size", "k8s", "pods"]


def test_a_long_question_keeps_its_identifiers_among_the_terms_searched() -> None:
    """Only the first 32 terms were searched: an error code after 43 words of context was not (red-team repro)."""
    from amfs_server.core.retrieval import MAX_QUERY_TERMS

    context = " ".join(f"word{chr(97 + i // 26)}{chr(97 + i % 26)}" for i in range(43))
    terms = keyword_terms(f"{context} which runbook covers ERR_LEDGER_422 on port 8080?")
    assert len(terms) == MAX_QUERY_TERMS and terms[-2:] == ["err_ledger_422", "8080"]
    assert terms[:3] == ["wordaa", "wordab", "wordac"]  # the first words, in order, as many as fit
    # Many identifier-like words crowd out none of the first 24 words
    numbered = keyword_terms("What do the notes say about " + " ".join(f"topic{j}" for j in range(200)) + "?")
    assert numbered[:2] == ["notes", "say"] and numbered[-1] == "topic29" and len(numbered) == MAX_QUERY_TERMS
    short = "which runbook covers ERR_LEDGER_422 on port 8080?"
    assert keyword_terms(short) == ["runbook", "covers", "err_ledger_422", "port", "8080"]  # under the cap: unchanged


def test_weighted_rrf_sums_weight_over_k_plus_rank() -> None:
    fused = fuse(
        [RankedList("semantic", ["a", "b"], [0.9, 0.8]), RankedList("keyword", ["b"], [3.0])],
        {"semantic": 0.4, "keyword": 0.2},
        k=60,
    )
    scores = {key: score for key, score, _ in fused}
    assert scores["a"] == pytest.approx(0.4 / 61)
    assert scores["b"] == pytest.approx(0.4 / 62 + 0.2 / 61)
    assert [key for key, _, _ in fused] == ["b", "a"]


def test_tied_scores_share_a_rank() -> None:
    (first, second) = fuse([RankedList("confidence", ["a", "b"], [1.0, 1.0])], {"confidence": 1.0}, k=60)
    assert first[1] == second[1] and first[2]["confidence"].rank == second[2]["confidence"].rank == 1


def test_a_trained_ranker_takes_thirty_percent_and_the_rest_scale_to_seventy() -> None:
    weights = resolve_weights(None, learned_available=True, fusion="rrf")
    assert weights["learned"] == pytest.approx(0.3)
    assert weights["semantic"] == pytest.approx(0.28) and weights["keyword"] == pytest.approx(0.14)
    assert sum(weights.values()) == pytest.approx(1.0)
    assert resolve_weights(None, learned_available=False)["learned"] == 0.0


def test_normalised_maps_the_best_score_to_one_and_the_pool_floor_to_zero() -> None:
    ranking = RankedList.from_scored("keyword", [("a", 9.0), ("b", 5.0), ("c", 1.0), ("d", 0.5)])
    assert normalised(ranking, pool=3) == {"a": 1.0, "b": 0.5, "c": 0.0, "d": 0.0}


def test_normalised_gives_ties_no_order_of_their_own() -> None:
    assert normalised(RankedList.from_scored("confidence", [("a", 1.0), ("b", 1.0)])) == {"a": 0.0, "b": 0.0}


def test_hybrid_fusion_lets_a_decisive_keyword_match_win_over_a_semantic_near_tie() -> None:
    semantic = RankedList.from_scored("semantic", [("a", 0.62), ("b", 0.61), ("c", 0.30)])
    keyword = RankedList.from_scored("keyword", [("b", 0.9), ("a", 0.1), ("c", 0.05)])  # b holds most of the query
    fused = fuse_hybrid([semantic, keyword], {"semantic": 0.3, "keyword": 0.7}, pool=3)
    assert [key for key, _, _ in fused][:2] == ["b", "a"]
    assert fused[0][2]["keyword"].contribution == pytest.approx(0.63)


def test_the_best_keyword_hit_counts_by_its_share_of_the_query_not_by_being_best() -> None:
    """Min-max would give the best keyword hit full marks even when it shares one common word with the question."""
    semantic = RankedList.from_scored("semantic", [("paraphrase", 0.70), ("near", 0.60), ("incidental", 0.30)])
    keyword = RankedList.from_scored("keyword", [("incidental", 0.15), ("near", 0.05)])
    fused = fuse_hybrid([semantic, keyword], {"semantic": 0.3, "keyword": 0.7}, pool=3)
    assert [key for key, _, _ in fused][0] == "paraphrase"
    assert fused[0][2]["semantic"].contribution == pytest.approx(0.3)
    capped = fuse_hybrid([RankedList.from_scored("keyword", [("repeats", 1.8)])], {"keyword": 0.7})
    assert capped[0][1] == pytest.approx(0.7)  # a bm25-style score above 1 is capped at the full weight


def test_query_blind_strategies_break_near_ties_but_never_outvote_a_clear_relevance_gap() -> None:
    semantic = RankedList.from_scored("semantic", [("relevant", 0.9), ("close", 0.895), ("weak", 0.5), ("floor", 0.1)])
    day = 86400.0
    recent = RankedList.from_scored("temporal", [("weak", 20 * day), ("close", 10 * day), ("relevant", 0.0)])
    weights = resolve_weights(None, learned_available=False)
    fused = [key for key, _, _ in fuse_hybrid([semantic, recent], weights, pool=4)]
    assert fused[:2] == ["close", "relevant"]  # a near-tie goes to the more recent entry
    assert fused.index("weak") > fused.index("relevant")  # recency alone cannot lift a weak match above a strong one


def test_a_tie_breaker_divides_by_at_least_its_fixed_spread() -> None:
    """Where every candidate tied but one, that one took a tie-breaker's whole share: a red-team pass's poisoned
    copies written later with confidence 1.5 ranked first for 37 of 60 questions (0.7.11)."""
    confidence = RankedList.from_scored("confidence", [("risky", 1.5), *[(f"turn-{n}", 1.0) for n in range(9)]])
    hour = 3600.0
    temporal = RankedList.from_scored("temporal", [("later", hour), *[(f"turn-{n}", 0.0) for n in range(9)]])
    weights = resolve_weights(None, learned_available=False)
    parts = {key: score for key, score, _ in fuse_hybrid([confidence], weights)}
    assert parts["risky"] == pytest.approx(weights["confidence"] * 0.5) and parts["turn-0"] == 0.0
    parts = {key: score for key, score, _ in fuse_hybrid([temporal], weights)}
    assert parts["later"] == pytest.approx(weights["temporal"] / 720)
    spread = RankedList.from_scored("confidence", [("a", 0.9), ("b", 0.3)])  # a spread of 0.6 is divided by 1.0
    assert normalised(spread, min_range=1.0) == pytest.approx({"a": 0.6, "b": 0.0})
    assert normalised(spread) == pytest.approx({"a": 1.0, "b": 0.0})


def test_unknown_fusion_is_refused() -> None:
    from amfs_server.adapters.sqlite import SQLiteStore

    with pytest.raises(ValidationError, match="Unknown fusion"):
        MemoryService(SQLiteStore(":memory:"), ServiceConfig(fusion="borda"))


def test_unknown_strategy_weight_is_refused() -> None:
    with pytest.raises(ValidationError, match="Unknown retrieval strategy"):
        resolve_weights({"vibes": 1.0}, learned_available=False)


@pytest.mark.parametrize("weight", [float("nan"), float("inf"), True, -0.1, "0.5"])
def test_a_weight_that_is_not_a_finite_number_is_refused(weight: object) -> None:
    """A red-team finding: NaN made every score NaN in an arbitrary order, inf gave inf and NaN, True was 1.0."""
    with pytest.raises(ValidationError, match="Weight for semantic must be a finite number >= 0"):
        resolve_weights({"semantic": weight}, learned_available=False)


async def test_semantic_strategy_finds_a_paraphrase_with_no_shared_words(rsvc: MemoryService, actor: Actor) -> None:
    await _seed(rsvc, actor)
    results = await rsvc.retrieve(actor, "how do we handle declined payments?", weights={"semantic": 1.0, "keyword": 0.0,
                                                                                          "temporal": 0.0, "confidence": 0.0})
    assert results[0].entry.entry_key == "payments/retry-pattern"


async def test_keyword_strategy_matches_any_term_of_a_question(rsvc: MemoryService, actor: Actor) -> None:
    await _seed(rsvc, actor)
    only_keyword = {"semantic": 0.0, "keyword": 1.0, "temporal": 0.0, "confidence": 0.0}
    results = await rsvc.retrieve(actor, "which incident was ERR_LEDGER_409 about?", weights=only_keyword, explain=True)
    assert results[0].entry.entry_key == "data/etl/task-summary-backfill"
    assert results[0].strategies["keyword"].rank == 1


async def test_keyword_ranking_weighs_a_rare_word_over_common_ones(store, actor: Actor) -> None:
    """Both stores rank by how distinctive the matched words are (bm25 / summed IDF), not by how many match."""
    svc = MemoryService(store, ServiceConfig(), embedder=None)
    await svc.open()
    filler = [WriteRequest("svc", f"deploy-note-{i}", f"deploy checklist step {i}: check the dashboard") for i in range(12)]
    await svc.write_many(actor, [
        *filler,
        WriteRequest("svc", "common-words", "deploy the dashboard, then check the deploy dashboard again"),
        WriteRequest("svc", "rare-word", "the flamegraph showed lock contention"),
    ])
    hits = await store.keyword_candidates(["deploy", "dashboard", "flamegraph"], EntryFilter(), utcnow(), 20)
    assert hits[0][0].key == "rare-word" and len(hits) == 14
    assert hits[0][1] > max(score for _, score in hits[1:]) > 0


async def test_an_identifier_matches_as_a_whole_not_by_its_parts(store, actor: Actor) -> None:
    svc = MemoryService(store, ServiceConfig(), embedder=None)
    await svc.open()
    await svc.write_many(actor, [
        WriteRequest("ledger", "error-code", "Postings rejected with ERR_LEDGER_409 are safe to retry."),
        WriteRequest("ledger", "owner", "The ledger team owns error budgets; page them for 409 spikes."),
    ])
    only_keyword = {"semantic": 0.0, "keyword": 1.0, "temporal": 0.0, "confidence": 0.0}
    results = await svc.retrieve(actor, "ERR_LEDGER_409", weights=only_keyword)
    assert [r.entry.key for r in results] == ["error-code"]


async def test_temporal_strategy_prefers_the_newest_of_the_pool(rsvc: MemoryService, actor: Actor, monkeypatch) -> None:
    from amfs_server.core import service as service_module

    real_now = service_module.utcnow
    monkeypatch.setattr(service_module, "utcnow", lambda: real_now() - timedelta(hours=3))
    await rsvc.write(actor, WriteRequest("svc", "old-retry", "retry policy: 3 attempts"))
    monkeypatch.setattr(service_module, "utcnow", real_now)
    await rsvc.write(actor, WriteRequest("svc", "new-retry", "retry policy: 7 attempts"))
    only_temporal = {"semantic": 0.0, "keyword": 0.0, "temporal": 1.0, "confidence": 0.0}
    results = await rsvc.retrieve(actor, "retry policy", weights=only_temporal, explain=True)
    assert [r.entry.key for r in results[:2]] == ["new-retry", "old-retry"]
    assert [r.strategies["temporal"].rank for r in results[:2]] == [1, 2]


async def test_entries_written_within_the_same_hour_tie_on_recency(rsvc: MemoryService, actor: Actor) -> None:
    """Seconds apart in one session say nothing about relevance: recency must not reorder such facts."""
    await rsvc.write(actor, WriteRequest("team", "priya-fruit", "Priya's favourite fruit is apricot."))
    await rsvc.write(actor, WriteRequest("team", "omar-fruit", "Omar's favourite fruit is melon."))
    results = await rsvc.retrieve(actor, "What is Priya's favourite fruit?", explain=True)
    assert results[0].entry.key == "priya-fruit"
    ranks = {r.entry.key: r.strategies["temporal"].rank for r in results}
    written = {r.entry.key: r.entry.provenance.written_at for r in results}
    if written["priya-fruit"].replace(minute=0, second=0, microsecond=0) == written["omar-fruit"].replace(
        minute=0, second=0, microsecond=0
    ):  # not across a clock hour (the test may run at hh:59:59)
        assert ranks["priya-fruit"] == ranks["omar-fruit"] == 1


async def test_confidence_strategy_prefers_higher_effective_confidence(rsvc: MemoryService, actor: Actor) -> None:
    await rsvc.write(actor, WriteRequest("svc", "shaky", "cache ttl is 60s", confidence=0.3))
    await rsvc.write(actor, WriteRequest("svc", "solid", "cache ttl is 300s", confidence=0.95))
    only_confidence = {"semantic": 0.0, "keyword": 0.0, "temporal": 0.0, "confidence": 1.0}
    results = await rsvc.retrieve(actor, "cache ttl", weights=only_confidence)
    assert [r.entry.key for r in results[:2]] == ["solid", "shaky"]


async def test_fusion_explains_each_strategy_rank_and_score(rsvc: MemoryService, actor: Actor) -> None:
    await _seed(rsvc, actor)
    (top, *_) = await rsvc.retrieve(actor, "OOMKilled pods connection pool", explain=True)
    assert top.entry.entry_key == "infra/k8s/risk-oom"
    assert set(top.strategies) >= {"semantic", "keyword", "temporal", "confidence"}
    assert top.score == pytest.approx(sum(hit.contribution for hit in top.strategies.values()))
    assert "explain" in top.to_dict() and top.to_dict()["entry"]["embedding"] is None
    plain = await rsvc.retrieve(actor, "OOMKilled pods connection pool")
    assert plain[0].strategies is None


async def test_filters_scope_results(rsvc: MemoryService, actor: Actor) -> None:
    await _seed(rsvc, actor)
    await rsvc.write(actor, WriteRequest("payments/refunds", "belief-slow", "Refund retries are slow", memory_type="belief",
                                         confidence=0.4))
    scoped = await rsvc.retrieve(actor, "retries", entity_path="payments")
    assert {r.entry.entity_path for r in scoped} <= {"payments", "payments/refunds"} and scoped
    beliefs = await rsvc.retrieve(actor, "retries", memory_type="belief")
    assert [r.entry.key for r in beliefs] == ["belief-slow"]
    confident = await rsvc.retrieve(actor, "retries", min_confidence=0.5)
    assert "belief-slow" not in {r.entry.key for r in confident}


async def test_depth_one_searches_only_hot_entries(rsvc: MemoryService, actor: Actor) -> None:
    await rsvc.write(actor, WriteRequest("svc", "fresh", "deploys happen on tuesdays", importance_score=1.0))
    await rsvc.write(actor, WriteRequest("svc", "cold", "deploys happen on fridays", confidence=0.05, importance_score=0.0))
    hot_only = await rsvc.retrieve(actor, "when do deploys happen", depth=1)
    everything = await rsvc.retrieve(actor, "when do deploys happen", depth=3)
    assert [r.entry.key for r in hot_only] == ["fresh"]
    assert {r.entry.key for r in everything} == {"fresh", "cold"}
    assert all(int(r.entry.tier) == 1 for r in hot_only)


async def test_results_carry_the_tier_as_of_the_time_of_asking(store, embedder, actor: Actor) -> None:
    # The stored tier is the one of the last write or read; a retrieve works the tier out again for what it returns,
    # and for the learned ranker, whose features read it (ml/features.py).
    from datetime import timedelta

    from amfs_server.core.models import utcnow

    clock = [utcnow()]
    svc = MemoryService(store, ServiceConfig(), embedder=embedder, clock=lambda: clock[0])
    await svc.open()
    await svc.write(actor, WriteRequest("svc", "aging", "deploys happen on tuesdays", importance_score=1.0))
    [fresh] = await svc.retrieve(actor, "when do deploys happen", depth=3)
    seen: list[int] = []

    def scorer(entries, ranks, entity_path):
        seen.extend(int(entry.tier) for entry in entries)
        return [0.0] * len(entries)

    svc.install_learned_scorer(scorer)
    clock[0] += timedelta(days=120)
    [aged] = await svc.retrieve(actor, "when do deploys happen", depth=3)
    assert int(fresh.entry.tier) == 1 and int(aged.entry.tier) > 1  # stored HOT, returned as it stands now
    assert seen and min(seen) > 1


async def test_min_confidence_and_depth_find_passing_entries_that_many_failing_ones_outrank(
        rsvc: MemoryService, actor: Actor) -> None:
    # 120 unverified guesses match the question better than the verified answers: the filters must look past
    # the searches' first 50 candidates, not filter them (until 0.7.9 both calls returned nothing).
    guesses = [WriteRequest("ops", f"guess-{i}", f"Unverified guess {i}: how long does the database failover take? "
                            f"Maybe {i} seconds.", confidence=0.05, importance_score=0.0) for i in range(120)]
    verified = [WriteRequest("ops", "answer", "Verified: switching the primary DB over to the replica completes in "
                             "30 seconds.", confidence=0.95, importance_score=1.0),
                WriteRequest("ops", "backups", "Verified: nightly backups go to cold storage.", confidence=0.95,
                             importance_score=1.0),
                WriteRequest("ops", "oncall", "Verified: the on-call rota changes on Mondays.", confidence=0.95,
                             importance_score=1.0)]
    await rsvc.write_many(actor, [*guesses, *verified])
    question = "how long does the database failover take?"
    unfiltered = await rsvc.retrieve(actor, question, entity_path="ops", limit=10, count_as_read=False)
    assert all(r.entry.key.startswith("guess-") for r in unfiltered)  # the answers are outranked
    for filters in ({"min_confidence": 0.9}, {"depth": 1}):
        found = await rsvc.retrieve(actor, question, entity_path="ops", limit=10, count_as_read=False, **filters)
        assert {r.entry.key for r in found} == {"answer", "backups", "oncall"}, filters
        assert found[0].entry.key == "answer", filters


async def test_retrieved_entries_are_tracked_but_only_returned_ones_are_recalled(rsvc: MemoryService, actor: Actor) -> None:
    await _seed(rsvc, actor)
    (top,) = await rsvc.retrieve(actor, "JWT signing", limit=1)
    assert top.entry.recall_count == 1
    reads = await rsvc.store.session_reads(actor.session_id)
    assert [(t.entity_path, t.key) for t in reads] == [(top.entry.entity_path, top.entry.key)]
    others = await rsvc.search(sort_by="recall_count")
    assert sum(e.recall_count for e in others) == 1
    record = await rsvc.commit_outcome(actor, "DEP-1", "success")
    assert [e.entry_key for e in record.effects] == [top.entry.entry_key]


async def test_new_versions_replace_old_ones_in_semantic_results(rsvc: MemoryService, actor: Actor) -> None:
    await rsvc.write(actor, WriteRequest("svc", "db", "we use MySQL 5.7 for orders"))
    await rsvc.retrieve(actor, "orders database")
    await rsvc.write(actor, WriteRequest("svc", "db", "we moved orders to PostgreSQL 16"))
    results = await rsvc.retrieve(actor, "orders database")
    assert [(r.entry.key, r.entry.version) for r in results] == [("db", 2)]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"query": ""}, "non-empty"), ({"query": "x" * 2001}, "limit is 2000"), ({"depth": 4}, "depth"),
     ({"limit": 0}, "limit"), ({"entity_path": "a//b"}, "empty segment")],
)
async def test_bad_retrieve_input_is_refused(rsvc: MemoryService, actor: Actor, kwargs: dict, message: str) -> None:
    arguments = {"query": "anything", **kwargs}
    with pytest.raises(ValidationError, match=message):
        await rsvc.retrieve(actor, **arguments)


async def test_without_an_embedder_retrieval_still_runs_on_keywords(service: MemoryService, actor: Actor) -> None:
    await service.write(actor, WriteRequest("svc", "k", "the deploy freeze starts friday"))
    (result,) = await service.retrieve(actor, "deploy freeze", explain=True)
    assert "semantic" not in result.strategies and result.strategies["keyword"].rank == 1


async def test_expired_entries_never_come_back(rsvc: MemoryService, actor: Actor, monkeypatch) -> None:
    await rsvc.write(actor, WriteRequest("svc", "temp", "temporary deploy freeze", ttl_seconds=60))
    from amfs_server.core import service as service_module

    real_now = service_module.utcnow
    monkeypatch.setattr(service_module, "utcnow", lambda: real_now() + timedelta(minutes=5))
    assert await rsvc.retrieve(actor, "deploy freeze") == []


async def test_words_common_to_most_entries_are_left_to_semantic_search(store, actor: Actor) -> None:
    svc = MemoryService(store, ServiceConfig(keyword_max_term_matches=3))
    await svc.open()
    for n in range(5):
        await svc.write(actor, WriteRequest("svc", f"note-{n}", f"the service handles request type {n}"))
    await svc.write(actor, WriteRequest("svc", "rare", "the service rejects ERR_QUOTA_7 requests"))
    assert await store.common_terms(["service", "err_quota_7"], 3) == {"service"}
    results = await svc.retrieve(actor, "service ERR_QUOTA_7", explain=True)
    assert [r.entry.key for r in results if "keyword" in r.strategies] == ["rare"]


async def test_a_larger_limit_extends_the_ranking_of_a_smaller_one(rsvc: MemoryService, actor: Actor) -> None:
    # Many entries share a few common words, so the keyword pool's cut falls among tied weak matches: a pool that
    # grew with the limit (it was 5 x limit) let limit 20 admit matches limit 10 had cut, and reorder its top 10.
    import random

    rng = random.Random(7)
    vocabulary = ["deploy", "canary", "rollback", "billing", "invoice", "ledger", "cache", "redis", "queue", "kafka",
                  "token", "oauth", "latency", "timeout", "retry", "backoff", "schema", "migration", "index", "vacuum"]
    await rsvc.write_many(actor, [
        WriteRequest("ops/notes", f"note-{i:03d}", " ".join(rng.sample(vocabulary, 4)) + f" (note {i})")
        for i in range(240)
    ])
    # Each of these reordered its top 10 between limit 10 and 20 with the 5 x limit pool.
    for words in (("deploy", "canary"), ("deploy", "billing"), ("deploy", "token"), ("deploy",), ("canary",)):
        question = "what about " + " and ".join(words) + "?"
        ten = [hit.entry.key for hit in await rsvc.retrieve(actor, question, limit=10, count_as_read=False)]
        twenty = [hit.entry.key for hit in await rsvc.retrieve(actor, question, limit=20, count_as_read=False)]
        assert len(ten) == 10 and twenty[:10] == ten, question


def test_speaker_label_is_the_name_a_transcript_turn_opens_with() -> None:
    from amfs_server.core.retrieval import speaker_label

    assert speaker_label("Caroline: I went to a support group yesterday.") == "Caroline"
    assert speaker_label("Mary Ann: we moved to Leeds.") == "Mary Ann"
    assert speaker_label("  O'Brien: fine.") == "O'Brien"
    for value in ("note: lower-case labels are prose", "The fix: use a retry", "Caroline said: hello",
                  "Caroline:no space after the colon", {"speaker": "Caroline"}, 42):
        assert speaker_label(value) is None, value
    # Any script's capitals, and a decomposed accent read as its letter (red-team repro: only [A-Z] counted)
    assert speaker_label("Émile: on se voit demain") == "Émile"
    assert speaker_label("Ömer Faruk: I moved to Izmir") == "Ömer Faruk"
    assert speaker_label("Zoe\u0308: hi") == "Zo\u00eb" and speaker_label("élodie: lower-case") is None
    # A long value a retrieval read by its head (its JSON's first characters)
    assert speaker_label(ValueHead('"Caroline: I went to \\"the\\" group', 90_000)) == "Caroline"
    assert speaker_label(ValueHead('{"text": "Caroline: hi', 90_000)) is None


def test_speaker_rule_knows_a_full_name_by_its_first_word() -> None:
    from amfs_server.core.models import MemoryEntry, Provenance
    from amfs_server.core.retrieval import speaker_matches

    def entry(path_key: str, value: str) -> MemoryEntry:
        path, key = path_key.split("/")
        return MemoryEntry(entity_path=path, key=key, value=value, version=1, confidence=1.0,
                           provenance=Provenance("a", "s", utcnow()))

    turns = [entry("c/t1", "Amara Nwosu: we booked the ferry"), entry("c/t2", "Jonas Berg: I booked nothing"),
             entry("c/t3", "The Bot: booked"), entry("c/t4", "no label: here")]
    assert speaker_matches("What did Amara book?", turns) == [("c/t1", 1.0)]
    assert speaker_matches("what did amara nwosu book", turns) == [("c/t1", 1.0)]
    assert speaker_matches("What did Nwosu book?", turns) == []  # a surname alone is not the given name
    assert speaker_matches("what did the team book?", turns) == []  # "The Bot" is not named by "the"
    zoe = [entry("c/t5", "Zo\u00eb: I booked the ferry")]
    assert speaker_matches("What did Zoe\u0308 book?", zoe) == [("c/t5", 1.0)]  # typed decomposed
    assert speaker_matches("what did the bot book?", turns) == [("c/t3", 1.0)]


async def test_speaker_when_weighted_breaks_ties_toward_what_the_named_person_said(rsvc: MemoryService,
                                                                                   actor: Actor) -> None:
    from amfs_server.core.retrieval import HYBRID_WEIGHTS, SPEAKER_WEIGHT

    await rsvc.write_many(actor, [
        WriteRequest("chat/c1", "t1", "Melanie: I adopted a beagle puppy last spring, his name is Biscuit."),
        WriteRequest("chat/c1", "t2", "Caroline: I adopted a beagle puppy last spring, his name is Pepper."),
        WriteRequest("chat/c1", "t3", "Caroline: Work has been hectic, the quarterly audit starts on Monday."),
    ])
    question = "What is the name of Caroline's beagle puppy?"
    hits = await rsvc.retrieve(actor, question, entity_path="chat/c1", weights={"speaker": SPEAKER_WEIGHT},
                               explain=True, count_as_read=False)
    assert hits[0].entry.key == "t2"  # the same words as t1: the speaker decides
    assert hits[0].strategies is not None and hits[0].strategies["speaker"].contribution > 0
    # An unrelated turn by the named person is not lifted above a relevant turn by someone else.
    assert [h.entry.key for h in hits].index("t1") < [h.entry.key for h in hits].index("t3")
    # Off by default (README: it pays only while nearly every evidence turn is the named person's own).
    assert HYBRID_WEIGHTS["speaker"] == 0.0
    plain = await rsvc.retrieve(actor, question, entity_path="chat/c1", explain=True, count_as_read=False)
    assert plain and all("speaker" not in (h.strategies or {}) for h in plain)  # not even worked out


class TopicEmbedder:
    """A test double whose vector counts topic words (one axis each): cosines are known by construction."""

    TOPICS = ("kitten", "mondays", "coffee", "garden", "skydive")
    name, dimension = "topic-words", 384

    def embed(self, texts: list[str]):
        import numpy as np

        rows = np.zeros((len(texts), self.dimension), dtype=np.float32)
        for i, text in enumerate(texts):
            for axis, topic in enumerate(self.TOPICS):
                rows[i, axis] = text.lower().count(topic)
            rows[i, len(self.TOPICS)] = 0.01  # never a zero vector
            rows[i] /= np.linalg.norm(rows[i])
        return rows


def test_entry_similarity_mixes_the_mean_and_the_best_passage() -> None:
    import numpy as np

    from amfs_server.core.embedding import PASSAGE_SHARE, entry_similarity

    query = np.array([1.0, 0.0], dtype=np.float32)
    passages = np.array([[0.0, 1.0], [1.0, 0.0]], dtype=np.float32)
    assert entry_similarity(0.5, passages, query) == pytest.approx((1 - PASSAGE_SHARE) * 0.5 + PASSAGE_SHARE * 1.0)
    assert entry_similarity(0.5, None, query) == 0.5  # one passage: its vector is the entry's


async def test_the_best_sentence_lifts_a_many_topic_turn_over_a_closer_mean(store, actor: Actor) -> None:
    svc = MemoryService(store, ServiceConfig(), embedder=TopicEmbedder())
    await svc.open()
    await svc.write_many(actor, [
        # Three sentences, one about the kitten: mean cosine to "kitten" 0.58, best sentence 1.0.
        WriteRequest("chat", "many-topics", "Ugh, mondays again. Coffee first. Meet my new kitten!"),
        # One sentence on two topics: cosine 0.71, no better sentence.
        WriteRequest("chat", "two-topics", "My kitten hates mondays"),
    ])
    sem = {"semantic": 1.0, "keyword": 0.0, "temporal": 0.0, "confidence": 0.0}
    hits = await svc.retrieve(actor, "kitten", entity_path="chat", weights=sem, explain=True, count_as_read=False)
    assert [h.entry.key for h in hits] == ["many-topics", "two-topics"]
    assert hits[0].strategies is not None
    assert hits[0].strategies["semantic"].raw_score == pytest.approx(0.5 * 0.577 + 0.5 * 1.0, abs=0.01)
    assert hits[1].strategies["semantic"].raw_score == pytest.approx(0.707, abs=0.01)


async def test_a_reply_is_found_through_the_turn_it_answers(store, actor: Actor) -> None:
    svc = MemoryService(store, ServiceConfig(), embedder=TopicEmbedder())
    await svc.open()
    for key, text in [("t1", "Jonah: We want to skydive for my birthday!"), ("t2", "Felix: Count me out, I get dizzy."),
                      ("t3", "Felix: Work was long today."), ("note", "buy milk on the way home")]:
        await svc.write(actor, WriteRequest("chat", key, text))  # one turn at a time, as a client writes them
    sem = {"semantic": 1.0, "keyword": 0.0, "temporal": 0.0, "confidence": 0.0}
    hits = await svc.retrieve(actor, "skydive", entity_path="chat", weights=sem, explain=True, count_as_read=False)
    assert [h.entry.key for h in hits][:2] == ["t1", "t2"]
    # t2's own words say nothing of skydiving: half its score comes from its context passage (t1 then t2).
    assert hits[1].strategies is not None and hits[1].strategies["semantic"].raw_score == pytest.approx(0.5, abs=0.02)
    assert hits[2].strategies["semantic"].raw_score < 0.1
    entries = {e.key: e for e in await svc.store.find_current(EntryFilter(entity_path="chat"), utcnow(), "recency", 10)}
    context = await svc.store.passage_vectors([entries["t2"], entries["note"]])
    assert list(context) == ["chat/t2"] and context["chat/t2"].shape == (2, 384)  # its own embedding, the context's
    expected = TopicEmbedder().embed(["chat message: Jonah: We want to skydive for my birthday! Felix: Count me out, I get dizzy."])
    assert context["chat/t2"][1] == pytest.approx(expected[0], abs=1e-6)
    # Forgetting t1 takes what its text lent t2: skydiving no longer finds the reply.
    await svc.forget("chat", "t1")
    after = await svc.retrieve(actor, "skydive", entity_path="chat", weights=sem, explain=True, count_as_read=False)
    assert after[0].strategies is not None and after[0].strategies["semantic"].raw_score < 0.1
    t2 = await svc.store.get_current("chat", "t2", utcnow())
    assert t2 is not None and t2.passage_embeddings is None and t2.context_key is None


def test_the_keyword_length_factor_leaves_ordinary_entries_alone_and_shrinks_long_ones() -> None:
    words = [f"topic{n}" for n in range(320)]
    assert distinct_words("svc retry: " + " ".join(words[:KEYWORD_LENGTH_PIVOT - 2])) == KEYWORD_LENGTH_PIVOT
    assert keyword_length_factor(KEYWORD_LENGTH_PIVOT) == 1.0
    assert distinct_words(" ".join(words[:2 * KEYWORD_LENGTH_PIVOT])) == 2 * KEYWORD_LENGTH_PIVOT
    assert keyword_length_factor(2 * KEYWORD_LENGTH_PIVOT) == pytest.approx(0.25)
    assert distinct_words(" ".join(words[:KEYWORD_LENGTH_PIVOT] * 5 + ["the", "a", "of"] * 50)) == KEYWORD_LENGTH_PIVOT
    assert distinct_words("") == 0 and keyword_length_factor(0) == 1.0
    # words joined by underscores count one by one, as PostgreSQL's parser splits them
    assert distinct_words("_".join(words[:2 * KEYWORD_LENGTH_PIVOT])) == 2 * KEYWORD_LENGTH_PIVOT


@pytest.mark.parametrize("joiner", ["\u00b2", "\u00bd", "\u0f2a", "\u2460", "\u19b0", "\u1cf2"])
def test_words_joined_by_a_character_an_index_splits_at_count_one_by_one(joiner: str) -> None:
    """A red-team finding: a store's index split 'what\u00b2did' into two words, the length factor counted one."""
    words = [f"word{n}x" for n in range(2 * KEYWORD_LENGTH_PIVOT)]
    assert distinct_words(joiner.join(words)) == 2 * KEYWORD_LENGTH_PIVOT


async def test_a_memory_stuffed_with_many_words_does_not_outrank_the_one_that_answers(
    rsvc: MemoryService, actor: Actor
) -> None:
    """Red-team style: one memory holding hundreds of common question words ranked first for half of a
    conversation's questions before the length factor."""
    await _seed(rsvc, actor)
    filler = [f"word{n}" for n in range(300)]
    stuffed = " ".join(["payment", "retries", "backoff", "gateway", "timeout", "deploy", "cache", "rotate"] + filler)
    await rsvc.write(actor, WriteRequest("svc/spam", "everything", stuffed))
    hits = {h.entry.entry_key: h.score for h in await rsvc.retrieve(actor, "how do payment retries back off?", limit=5)}
    assert max(hits, key=hits.__getitem__) == "payments/retry-pattern"
    assert hits.get("svc/spam/everything", 0.0) < 0.5 * hits["payments/retry-pattern"], hits


@pytest.mark.parametrize("query, expected", [
    ("What does ERR_LEDGER_409 mean?", True), ("what is retryPolicy set to?", True), ("who owns payments.gateway?", True),
    ("what caused INC-3?", True), ("is the v2 API deprecated?", True), ("why does POST /api/pay fail?", True),
    ("When did Theo start his new job?", False), ("What is the 12-mile route and/or the short one?", False),
    ("Did Dr. Smith call back?", False),
])
def test_an_identifier_is_told_from_words(query: str, expected: bool) -> None:
    assert names_an_identifier(query) is expected


async def test_a_question_naming_an_identifier_weighs_keyword_as_0_3_2_did(rsvc: MemoryService) -> None:
    actor = Actor("agent/test", "identifier-weights")
    await _seed(rsvc, actor)

    async def weights_used(query: str, **kwargs) -> tuple[float, float]:
        hit = (await rsvc.retrieve(actor, query, explain=True, **kwargs))[0]
        assert hit.entry.key == "task-summary-backfill"
        keyword, semantic = hit.strategies["keyword"], hit.strategies["semantic"]
        return keyword.contribution / min(keyword.raw_score, 1.0), semantic.contribution  # semantic's best: normalised 1

    assert await weights_used("which outage was ERR_LEDGER_409 about?") == pytest.approx((0.7, 0.3))
    assert await weights_used("which outage was the orders table backfill about?") == pytest.approx((0.5, 0.5))
    # Weights the caller chose are left as chosen.
    assert await weights_used("which outage was ERR_LEDGER_409 about?",
                              weights={"semantic": 0.5, "keyword": 0.5}) == pytest.approx((0.5, 0.5))


def test_resolve_weights_gives_an_identifier_question_the_keyword_share_unless_overridden() -> None:
    plain = resolve_weights(None, learned_available=False, query="which outage was this about?")
    named = resolve_weights(None, learned_available=False, query="which outage was ERR_LEDGER_409 about?")
    assert (plain["semantic"], plain["keyword"]) == (0.5, 0.5)
    assert (named["semantic"], named["keyword"]) == pytest.approx((0.3, 0.7))
    assert resolve_weights({"keyword": 0.6}, learned_available=False, query="ERR_LEDGER_409?")["semantic"] == 0.5
    assert resolve_weights(None, learned_available=False, fusion="rrf", query="ERR_LEDGER_409?")["keyword"] == 0.2


def test_an_embedder_with_its_own_semantic_share_gets_it_unless_overridden_or_an_identifier_is_named() -> None:
    from amfs_server.core.embedding import GEMMA
    from amfs_server.core.retrieval import EMBEDDER_SEMANTIC_SHARE

    assert EMBEDDER_SEMANTIC_SHARE[GEMMA] == 0.8  # keyed by the embedder's real name
    own = resolve_weights(None, learned_available=False, query="what did Caroline paint?", embedder=GEMMA)
    assert (own["semantic"], own["keyword"]) == pytest.approx((0.8, 0.2))
    default = resolve_weights(None, learned_available=False, query="what did Caroline paint?", embedder="other")
    assert (default["semantic"], default["keyword"]) == (0.5, 0.5)
    named = resolve_weights(None, learned_available=False, query="was ERR_LEDGER_409 fixed?", embedder=GEMMA)
    assert (named["semantic"], named["keyword"]) == pytest.approx((0.3, 0.7))
    chosen = resolve_weights({"semantic": 0.4}, learned_available=False, query="what?", embedder=GEMMA)
    assert (chosen["semantic"], chosen["keyword"]) == (0.4, 0.5)
    assert resolve_weights(None, learned_available=False, fusion="rrf", embedder=GEMMA)["semantic"] == 0.4


async def test_a_retrieve_returns_one_of_several_memories_with_the_same_text(store, actor: Actor) -> None:
    """29 copies of one memory took several places of one top ten (red-team finding, 0.7.11): copies collapse
    into the first ranked, and the ten places go to ten different texts."""
    svc = MemoryService(store, ServiceConfig(), embedder=None)
    await svc.open()
    copy = "Rotate the signing key with the vault CLI, never by hand, and log who rotated it."
    assert len(copy) >= 64  # COPY_MIN_CHARS: shorter values mean something different under each key
    await svc.write_many(actor, [WriteRequest("ops", f"copy-{n}", copy) for n in range(5)] + [
        WriteRequest("ops", f"other-{n}", f"Rotate the signing key note {n}: the vault keeps the old one a day.")
        for n in range(6)
    ] + [WriteRequest("ops", "dict-a", {"signing": "key", "rotate": "vault"}),
         WriteRequest("ops", "dict-b", {"signing": "key", "rotate": "vault"}),
         WriteRequest("flags", "signing-key-rotation", "vault"), WriteRequest("flags", "signing-key-store", "vault")])
    results = await svc.retrieve(actor, "rotate signing key vault", limit=20)
    values = [r.entry.value for r in results]
    assert values.count(copy) == 1 and len(results) == 11  # 15 memories, 4 copies of the long one collapsed
    assert sum(r.entry.key.startswith("other-") for r in results) == 6
    assert sum(r.entry.key.startswith("dict-") for r in results) == 2  # only string values are compared
    assert values.count("vault") == 2  # a short value stays under each key


async def test_a_future_event_time_ranks_as_now_on_recency(rsvc: MemoryService, actor: Actor) -> None:
    """An event_at of 2200 made a memory the newest of every pool and took the whole temporal share (red-team
    finding, 0.7.11): a future event is not more recent than now."""
    await rsvc.write(actor, WriteRequest("svc", "written-now", "deploy window is Friday"))
    await rsvc.write(actor, WriteRequest("svc", "far-future", "deploy window is Saturday", event_at="2200-01-01"))
    only_temporal = {"semantic": 0.0, "keyword": 0.0, "temporal": 1.0, "confidence": 0.0}
    results = await rsvc.retrieve(actor, "deploy window", weights=only_temporal, explain=True)
    ranks = {r.entry.key: r.strategies["temporal"].rank for r in results}
    by_key = {r.entry.key: r.entry for r in results}
    assert by_key["far-future"].event_at is not None and by_key["far-future"].event_at.year == 2200  # kept as given
    if by_key["written-now"].provenance.written_at.hour == utcnow().hour:  # not across a clock hour
        assert ranks["far-future"] == ranks["written-now"] == 1


def test_near_copies_are_different_texts_sharing_most_of_their_words() -> None:
    real = "Caroline: I went to the LGBTQ support group on Friday and it was so powerful."
    fake = real.replace("Friday", "Monday")
    added = real + " Actually no, that got cancelled in the end."
    values = [real, fake, "Melanie: The support group sounds great, I am proud of you for going.", real, added,
              {"text": real}, "Caroline: Friday!", "x " * 3000 + real]
    found = near_copies(values)
    assert found[0] == [1, 4] and found[1] == [0, 3, 4] and found[4] == [0, 1, 3]
    assert found[3] == [1, 4]  # an exact copy of 0 is not marked against it (copies collapse instead)
    assert found[2] == [] and found[5] == [] and found[6] == [] and found[7] == []  # unrelated, not text, short, long
    assert near_copies([]) == []
    # Invisible characters change no word a reader sees: a zero-width space in every word hid a fake (0.7.15).
    hidden = "\u200b".join(fake[i:i + 3] for i in range(0, len(fake), 3)) + "\u2060\n"
    assert near_copies([real, hidden, real.replace(" ", "\u00ad ") + "  "]) == [[1], [0, 2], [1]]


async def test_of_several_copies_the_earliest_written_takes_the_first_copys_place(store, actor: Actor, monkeypatch) -> None:
    """A copy written later ranks above the original on recency; it must not stand in for it."""
    from amfs_server.core import service as service_module

    svc = MemoryService(store, ServiceConfig(), embedder=None)
    await svc.open()
    text = "Payments retry three times with exponential backoff, then page the on-call engineer."
    real_now = service_module.utcnow
    monkeypatch.setattr(service_module, "utcnow", lambda: real_now() - timedelta(days=20))
    await svc.write(actor, WriteRequest("team", "payments-retry", text))
    monkeypatch.setattr(service_module, "utcnow", real_now)
    await svc.write(Actor("mallory", "s-m"), WriteRequest("team", "payments-retry-copy", text))
    results = await svc.retrieve(actor, "payments retry backoff", limit=5, explain=True)
    assert [r.entry.key for r in results] == ["payments-retry"]
    # Copies that read the same are copies: trailing spaces, zero-width characters inside words (0.7.15).
    await svc.write(Actor("mallory", "s-m"), WriteRequest("team", "copy-spaced", text + "   "))
    await svc.write(Actor("mallory", "s-m"), WriteRequest("team", "copy-hidden", text.replace("e", "e\u200b")))
    results = await svc.retrieve(actor, "payments retry backoff", limit=5, explain=True)
    assert [r.entry.key for r in results] == ["payments-retry"]


async def test_a_retrieve_ranks_on_heads_of_long_values_and_reads_whole_only_the_ones_it_returns(
    rsvc: MemoryService, actor: Actor, monkeypatch
) -> None:
    """100 candidates of 1 MiB were read whole to return ten (1.08 s and +190 MiB for one `amfs_retrieve` over 30
    values of 0.9 MB, `scripts/listing_heads.py`): candidates are read to a head, the returned ones whole."""
    from amfs_server.core.service import RANK_VALUE_HEAD

    await _seed(rsvc, actor)
    long_notes = {f"runbook-{n}": f"Runbook {n}: failed card charges are retried with exponential backoff. " + "Step. " * 5000
                  for n in range(3)}
    await rsvc.write_many(actor, [WriteRequest("payments", key, text) for key, text in long_notes.items()])
    read_whole: list[str] = []
    entry_values = rsvc.store.entry_values

    async def spy(entries, *, value_head=None):
        if value_head is None:
            read_whole.extend(e.key for e in entries)
        return await entry_values(entries, value_head=value_head)

    monkeypatch.setattr(rsvc.store, "entry_values", spy)
    question = "how are failed card charges retried?"
    whole = await rsvc.retrieve(actor, question, limit=2)
    assert any(h.entry.key in long_notes for h in whole)
    assert sorted(read_whole) == sorted(h.entry.key for h in whole if h.entry.key in long_notes)
    assert all(h.entry.value == long_notes[h.entry.key] for h in whole if h.entry.key in long_notes)
    read_whole.clear()
    headed = await rsvc.retrieve(actor, question, limit=5, whole_values=False)
    assert read_whole == []
    assert [(h.entry.key, h.score) for h in headed][:2] == [(h.entry.key, h.score) for h in whole]
    heads = [h.entry.value for h in headed if h.entry.key in long_notes]
    assert heads and all(isinstance(v, ValueHead) and len(v.json_head) == RANK_VALUE_HEAD for v in heads)
    # The ranking whole values give, as before 0.7.12 (candidates read whole): the same.
    from amfs_server.core import service as service_module

    monkeypatch.setattr(service_module, "RANK_VALUE_HEAD", None)
    read_whole.clear()
    ranked_whole = await rsvc.retrieve(actor, question, limit=5, count_as_read=False)
    assert not any(isinstance(h.entry.value, ValueHead) for h in ranked_whole)
    assert [(h.entry.key, h.score) for h in ranked_whole] == [(h.entry.key, h.score) for h in headed]


async def test_long_copies_collapse_only_when_their_whole_values_are_equal(store, actor: Actor) -> None:
    """Values read by their heads: two that share head and length are compared whole before they count as copies."""
    svc = MemoryService(store, ServiceConfig(), embedder=None)
    await svc.open()
    body = "The ledger reconciliation runs nightly and retries twice. " * 600
    await svc.write(actor, WriteRequest("team", "ledger", body + "Owner: Ana."))
    await svc.write(Actor("mallory", "s-m"), WriteRequest("team", "ledger-copy", body + "Owner: Ana."))
    await svc.write(actor, WriteRequest("team", "ledger-changed", body + "Owner: Bob."))
    for whole_values in (True, False):
        results = await svc.retrieve(actor, "ledger reconciliation", limit=5, whole_values=whole_values)
        assert sorted(r.entry.key for r in results) == ["ledger", "ledger-changed"], whole_values
