"""The conversational retrieval benchmark: its generated data, its scoring, its BM25 baseline and the harness."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from amfs_server.session_bench import conversation_bench as bench
from amfs_server.session_bench import make_conversation_dataset as gen


@pytest.fixture(scope="module")
def tiny() -> dict:
    """Two conversations of three sessions each: one tuning, one test."""
    return gen.build_dataset(seed=7, conversations=2, sessions=3)


def test_generator_is_deterministic_for_a_seed_and_changes_with_it(tiny):
    assert gen.build_dataset(seed=7, conversations=2, sessions=3) == tiny
    assert gen.build_dataset(seed=8, conversations=2, sessions=3) != tiny


def test_every_question_has_evidence_turns_that_exist_in_its_conversation(tiny):
    gen.validate(tiny)
    for conversation in tiny["conversations"]:
        keys = {t["key"] for t in bench.turns_of(conversation)}
        for question in conversation["questions"]:
            assert question["evidence"] and set(question["evidence"]) <= keys


def test_every_question_kind_is_present_in_each_conversation(tiny):
    for conversation in tiny["conversations"]:
        assert {q["kind"] for q in conversation["questions"]} == set(gen.KINDS)


def test_turns_carry_keys_speakers_and_their_sessions_date(tiny):
    conversation = tiny["conversations"][0]
    for session in conversation["sessions"]:
        for turn in session["turns"]:
            assert turn["key"].startswith(f"s{session['session']:02d}-t")
            assert turn["speaker"] in conversation["speakers"]
            assert turn["date"] == session["date"]
    assert bench.turn_value(conversation["sessions"][0]["turns"][0]).startswith(
        conversation["sessions"][0]["turns"][0]["speaker"] + ": ")


def test_splits_are_by_conversation_and_disjoint_in_the_committed_file():
    conversations = bench.load_conversations(split="all")
    tuning = {c["conversation_id"] for c in bench.load_conversations(split="tuning")}
    test = {c["conversation_id"] for c in bench.load_conversations(split="test")}
    assert tuning and test and not tuning & test
    assert tuning | test == {c["conversation_id"] for c in conversations}
    assert len(tuning) == len(test) == len(conversations) // 2


def test_committed_file_is_what_the_generator_writes():
    assert bench.DATASET.read_text() == gen.render(gen.build_dataset())


def test_committed_questions_are_paraphrased_and_conversations_are_full_size():
    stats = gen.statistics_of(json.loads(bench.DATASET.read_text()))
    assert stats["overlap_overall"] < 0.5
    assert 250 <= stats["turns_per_conversation"] <= 350 and 20 <= stats["sessions_per_conversation"] <= 30
    assert all(count > 0 for count in stats["questions_per_kind"].values())


def test_unknown_split_is_rejected_with_the_choices():
    with pytest.raises(ValueError, match="tuning, test, all"):
        bench.load_conversations(split="train")


def test_a_split_the_dataset_lacks_is_refused_naming_the_splits_it_has(tmp_path, capsys):
    test_only = gen.build_dataset(seed=7, conversations=2, sessions=3)
    test_only["conversations"] = [c for c in test_only["conversations"] if c["split"] == "test"]
    path = tmp_path / "test_only.json"
    path.write_text(json.dumps(test_only))
    with pytest.raises(SystemExit):
        bench.main(["--dataset", str(path), "--split", "tuning"])
    assert "has no conversations in the tuning split; its splits: test" in capsys.readouterr().err


def test_recall_counts_the_fraction_of_evidence_in_the_top_ten():
    ranked = ["a", "b", "x", "c", "d", "e", "f", "g", "h", "i", "y"]
    assert bench.score_question(ranked, ["x", "y"]) == {"recall@10": 0.5, "mrr@10": pytest.approx(1 / 3)}
    assert bench.score_question(ranked, ["a", "x"])["recall@10"] == 1.0


def test_mrr_is_the_reciprocal_rank_of_the_first_evidence_turn_within_ten():
    ranked = [f"k{i}" for i in range(1, 13)]
    assert bench.score_question(ranked, ["k1"])["mrr@10"] == 1.0
    assert bench.score_question(ranked, ["k4", "k2"])["mrr@10"] == 0.5
    assert bench.score_question(ranked, ["k11"]) == {"recall@10": 0.0, "mrr@10": 0.0}


def test_a_question_without_evidence_is_an_error():
    with pytest.raises(ValueError, match="evidence"):
        bench.score_question(["a"], [])


def test_bm25_ranks_the_obvious_match_first():
    index = bench.BM25({
        "t1": "Maya: I made a huge pot of soup today.",
        "t2": "Jonah: We adopted a beagle puppy named Biscuit!",
        "t3": "Maya: The weather has been awful all week.",
    })
    assert index.rank("What is the name of Jonah's beagle puppy?")[0] == "t2"
    assert index.rank("completely unrelated words") == []


def test_bm25_prefers_the_rarer_word():
    index = bench.BM25({"a": "soup soup today", "b": "kayak today", "c": "today today", "d": "soup"})
    assert index.rank("kayak soup")[0] == "b"


@pytest.mark.slow
def test_harness_runs_every_ranker_end_to_end_on_sqlite(tmp_path, capsys):
    data = gen.build_dataset(seed=3, conversations=2, sessions=3)
    for conversation in data["conversations"]:
        conversation["questions"] = conversation["questions"][:6]
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(data))
    out = tmp_path / "report.json"

    picture = tmp_path / "recall.png"
    report = bench.main(["--dataset", str(path), "--split", "all", "--json", str(out), "--plot", str(picture)])

    table = capsys.readouterr().out
    expected = [bench.FUSION, bench.WITH_SPEAKER, bench.SEED_RRF, *bench.SINGLE_STRATEGIES, bench.BM25_ROW]
    for name in expected:
        assert f"| {name} |" in table
    summary = report["runs"]["sqlite"]["summary"]
    assert list(summary) == expected
    assert set(summary[bench.FUSION]) == {"tuning", "test"}
    for name in expected:
        for split in ("tuning", "test"):
            assert summary[name][split]["overall"]["n"] == 6
            assert 0.0 <= summary[name][split]["overall"]["recall@10"] <= 1.0
    assert json.loads(out.read_text())["questions"] == 12
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # the per-kind picture was drawn


@pytest.mark.slow
@pytest.mark.parametrize("store, with_dates", [("sqlite", False), ("sqlite", True),
                                               pytest.param("postgres", False, marks=pytest.mark.postgres)])
def test_the_mcp_protocol_ranks_as_the_service_does_in_process(store: str, with_dates: bool):
    """amfs_write per turn and amfs_retrieve per question over stdio (a real server) give the in-process ranking,
    on either store, and with each turn's session date passed as its event time; the PostgreSQL run leaves no
    schema behind."""
    data = gen.build_dataset(seed=5, conversations=1, sessions=3)
    conversation = data["conversations"][0]
    conversation["questions"] = conversation["questions"][:8]
    schemas_before = asyncio.run(_bench_schemas()) if store == "postgres" else set()
    via_mcp = asyncio.run(bench.run_via_mcp([conversation], store, with_dates=with_dates))[bench.FUSION + " via MCP"]
    in_process = asyncio.run(bench.run_in_process([conversation], store, with_dates=with_dates,
                                                  selected={bench.FUSION: bench.service_ranker(None)}))[bench.FUSION]
    if store == "postgres":
        assert asyncio.run(_bench_schemas()) == schemas_before
    assert len(via_mcp) == 8 and any(row["recall@10"] > 0 for row in via_mcp)
    assert [(r["id"], r["recall@10"], r["mrr@10"]) for r in via_mcp] == \
        [(r["id"], r["recall@10"], r["mrr@10"]) for r in in_process]


async def _bench_schemas() -> set[str]:
    import asyncpg

    from amfs_server.session_bench import postgres_dsn

    conn = await asyncpg.connect(postgres_dsn())
    try:
        rows = await conn.fetch("SELECT schema_name FROM information_schema.schemata WHERE schema_name LIKE 'amfs_bench_mcp_%'")
    finally:
        await conn.close()
    return {row["schema_name"] for row in rows}


def test_rankers_return_one_ranked_list_per_question_from_the_conversation(tiny):
    conversation = tiny["conversations"][0]
    questions = conversation["questions"][:5]
    ranked = asyncio.run(bench.bm25_ranker(None, conversation, questions))
    keys = {t["key"] for t in bench.turns_of(conversation)}
    assert len(ranked) == 5 and all(len(r) <= bench.LIMIT and set(r) <= keys for r in ranked)


@pytest.mark.slow
def test_the_fusion_sweep_row_for_the_default_weights_is_the_default_fusion(monkeypatch):
    from datetime import datetime, timezone

    from amfs_server.session_bench import tune_fusion

    # One clock for both runs: recency ranks by the hour, so two runs that straddle an hour would rank apart.
    monkeypatch.setattr("amfs_server.core.service.utcnow", lambda: datetime(2026, 3, 2, 9, 30, tzinfo=timezone.utc))

    conversation = gen.build_dataset(seed=3, conversations=1, sessions=3)["conversations"][0]
    conversation = dict(conversation, questions=conversation["questions"][:16])  # a copy: the data set is shared
    from amfs_server.core.retrieval import HYBRID_WEIGHTS

    from amfs_server.core.embedding import PASSAGE_SHARE

    share = HYBRID_WEIGHTS["semantic"] / tune_fusion.RELEVANCE
    table = tune_fusion.sweep([conversation], (share, 0.9), (PASSAGE_SHARE, 0.0))
    default = asyncio.run(bench.run_in_process([conversation], "sqlite",
                                               selected={"d": bench.service_ranker(None)}))["d"]
    assert tune_fusion.weights_for(share) == pytest.approx(HYBRID_WEIGHTS)
    mine = table[(PASSAGE_SHARE, share)]
    assert mine["n"] == 16
    assert mine["recall@10"] == pytest.approx(sum(r["recall@10"] for r in default) / 16)
    assert mine["mrr@10"] == pytest.approx(sum(r["mrr@10"] for r in default) / 16)
    assert mine != table[(PASSAGE_SHARE, 0.9)]  # the weight is really applied
    assert mine != table[(0.0, share)]  # and the passage share



def test_reattributing_evidence_hands_that_share_of_evidence_turns_to_the_other_speaker():
    data = gen.build_dataset(seed=3, conversations=2, sessions=3)
    before = {(c["conversation_id"], t["key"]): t["speaker"] for c in data["conversations"] for t in bench.turns_of(c)}
    evidence = {(c["conversation_id"], key) for c in data["conversations"] for q in c["questions"] for key in q["evidence"]}

    moved = bench.reattribute_evidence(data["conversations"], 0.5)

    after = {(c["conversation_id"], t["key"]): t["speaker"] for c in data["conversations"] for t in bench.turns_of(c)}
    changed = {turn for turn in before if before[turn] != after[turn]}
    assert changed <= evidence and len(changed) == moved  # only evidence turns, each to the other speaker
    assert 0.3 * len(evidence) < moved < 0.7 * len(evidence)
    speakers = {c["conversation_id"]: {t["speaker"] for t in bench.turns_of(c)} for c in data["conversations"]}
    assert all(after[turn] in speakers[turn[0]] for turn in changed)
    assert bench.reattribute_evidence(data["conversations"], 0.0) == 0


def test_write_orders_keep_every_turn_and_move_them_as_named():
    """`--write-order`: the context passage's stress. Every turn is written once whatever the order; runs of 8 stay
    within their run; a shuffle moves turns across the whole conversation; the same seed, the same order."""
    turns = [{"key": f"D1:{n}"} for n in range(1, 42)]
    assert bench.write_order(turns, "given") == turns
    for order in ("runs-of-8", "shuffled"):
        written = bench.write_order(turns, order)
        assert sorted(t["key"] for t in written) == sorted(t["key"] for t in turns) and written != turns
        assert bench.write_order(turns, order) == written
    runs = bench.write_order(turns, "runs-of-8")
    assert all({t["key"] for t in runs[i:i + 8]} == {t["key"] for t in turns[i:i + 8]} for i in range(0, 41, 8))
    shuffled = bench.write_order(turns, "shuffled")
    assert any({t["key"] for t in shuffled[i:i + 8]} != {t["key"] for t in turns[i:i + 8]} for i in range(0, 41, 8))


def test_every_conversation_in_one_store_ranks_as_a_store_each():
    """`--one-store`: the held-out protocol may write every conversation through one server. Each question is
    scoped to its conversation, so the other conversations change nothing: the keyword IDF counts within the
    scope (N included) and semantic search filters by it."""
    data = gen.build_dataset(seed=7, conversations=2, sessions=3)
    for conversation in data["conversations"]:
        conversation["questions"] = conversation["questions"][:8]
    selected = {bench.FUSION: bench.service_ranker(None)}
    apart = asyncio.run(bench.run_in_process(data["conversations"], "sqlite", selected=selected))[bench.FUSION]
    together = asyncio.run(bench.run_in_process(data["conversations"], "sqlite", selected=selected,
                                                one_store=True))[bench.FUSION]
    assert len(together) == 16 and any(row["recall@10"] > 0 for row in together)
    assert [(r["id"], r["recall@10"], r["mrr@10"]) for r in together] == \
        [(r["id"], r["recall@10"], r["mrr@10"]) for r in apart]


def test_a_second_question_side_asks_the_same_store_and_pairs_question_by_question():
    """`--also-query-encoder`: the turns are written once and every ranker asks again through the other question
    side, its rows under `RANKER @SIDE`. Asked again through the same side, every question scores the same; through
    a side that puts every question on one fixed vector, the semantic ranker's scores change."""
    import numpy as np

    from amfs_server.adapters.embedders import TwoSidedEmbedder, load_embedder

    data = gen.build_dataset(seed=7, conversations=1, sessions=3)
    conversation = data["conversations"][0]
    conversation["questions"] = conversation["questions"][:8]
    embedder = load_embedder("chat-minilm")

    class OnePoint:
        name, dimension, loaded = "one point", embedder.dimension, True

        def check_available(self) -> None:
            pass

        def embed(self, texts):
            return np.tile(np.eye(1, self.dimension, dtype=np.float32), (len(texts), 1))

    selected = {"semantic": bench.service_ranker(bench.alone("semantic")), bench.FUSION: bench.service_ranker(None)}
    rows = asyncio.run(bench.run_in_process([conversation], "sqlite", embedder=embedder, selected=selected,
                                            also={"same": embedder, "blind": TwoSidedEmbedder(embedder, OnePoint())}))
    assert set(rows) == {f"{name}{suffix}" for name in selected for suffix in ("", " @same", " @blind")}
    score = lambda name: [(r["id"], r["recall@10"], r["mrr@10"]) for r in rows[name]]  # noqa: E731
    assert score("semantic @same") == score("semantic") and score(f"{bench.FUSION} @same") == score(bench.FUSION)
    assert [r["id"] for r in rows["semantic @blind"]] == [r["id"] for r in rows["semantic"]]
    assert score("semantic @blind") != score("semantic")

def test_a_second_question_side_is_refused_where_it_cannot_pair(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--also-query-encoder", "fast", "--via-mcp", "--conversations", "1"])
    assert "--also-query-encoder runs in process; drop --via-mcp" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--also-query-encoder", "turbo", "--conversations", "1"])
    assert "--also-query-encoder: invalid choice: 'turbo'" in capsys.readouterr().err


@pytest.mark.slow
def test_one_server_holding_every_conversation_ranks_over_mcp_as_in_process():
    """`--one-store --via-mcp`: one amfs-server over stdio holds both conversations; every question, scoped to its
    own through amfs_retrieve, ranks as a store per conversation does in process."""
    data = gen.build_dataset(seed=7, conversations=2, sessions=3)
    for conversation in data["conversations"]:
        conversation["questions"] = conversation["questions"][:6]
    selected = {bench.FUSION: bench.service_ranker(None)}
    apart = asyncio.run(bench.run_in_process(data["conversations"], "sqlite", selected=selected))[bench.FUSION]
    one_server = asyncio.run(bench.run_via_mcp(data["conversations"], one_store=True))[bench.FUSION + " via MCP"]
    assert len(one_server) == 12 and any(row["recall@10"] > 0 for row in one_server)
    assert [(r["id"], r["recall@10"], r["mrr@10"]) for r in one_server] == \
        [(r["id"], r["recall@10"], r["mrr@10"]) for r in apart]


def test_a_candidate_model_file_is_measured_like_the_shipped_model():
    """`--embedder PATH.onnx[.gz]` runs a candidate file through the same adapter: the shipped file given by path
    embeds exactly as the default does; a path that is not a model says so."""
    from amfs_server.adapters.embedders import load_embedder
    from amfs_server.adapters.onnx_embedder import VARIANTS
    from amfs_server.core.embedding import EmbedderUnavailableError
    from amfs_server.session_bench import bench_embedder

    shipped = VARIANTS["chat-int8"].bundled
    candidate = bench_embedder(str(shipped))
    assert candidate.name == "onnx-file:model_int8.onnx.gz"
    text = "Jonah: We want to skydive for my birthday!"
    assert candidate.embed([text]).tolist() == load_embedder("chat-minilm").embed([text]).tolist()
    from amfs_server.core.embedding import DEFAULT_EMBEDDER

    assert bench_embedder(None) is load_embedder(DEFAULT_EMBEDDER)  # the server's default
    assert bench_embedder(None, "fast") is load_embedder(DEFAULT_EMBEDDER, query_encoder="fast")
    with pytest.raises(ValueError, match="takes an embedder by name"):
        bench_embedder(str(shipped), "fast")
    with pytest.raises(EmbedderUnavailableError, match="does not exist"):
        bench_embedder("/nonexistent/model_int8.onnx")
    with pytest.raises(SystemExit):
        bench.main(["--embedder", "/nonexistent/model_int8.onnx", "--conversations", "1"])


def test_a_fine_tuned_model_folder_is_measured_on_torch_like_its_base(tmp_path):
    """`--embedder FOLDER` (what scripts/finetune_embedder.py writes) runs on the torch embedder of the folder's
    architecture under the folder's own name; base MiniLM's folder embeds exactly as the torch MiniLM does, and a
    folder that is not a model of a known architecture is refused with what is wrong."""
    import json

    from amfs_server.adapters.torch_embedder import MiniLMEmbedder
    from amfs_server.session_bench import bench_embedder

    base = MiniLMEmbedder().model_dir()
    candidate = bench_embedder(str(base))
    assert candidate.name == f"model-folder:{base.name}" and candidate.dimension == 384
    text = "Jonah: We want to skydive for my birthday!"
    assert candidate.embed([text]).tolist() == MiniLMEmbedder(num_threads=1).embed([text]).tolist()
    with pytest.raises(ValueError, match="no config.json"):
        bench_embedder(str(tmp_path))
    (tmp_path / "config.json").write_text("[1, 2")
    with pytest.raises(ValueError, match="not a JSON object"):
        bench_embedder(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ValueError, match="'gpt2' model"):
        bench_embedder(str(tmp_path))
    with pytest.raises(SystemExit):
        bench.main(["--embedder", str(tmp_path), "--conversations", "1"])
    with pytest.raises(SystemExit):
        bench.main(["--via-mcp", "--embedder", str(base), "--conversations", "1"])


def test_via_mcp_serves_with_the_embedder_asked_for_and_refuses_a_model_file(monkeypatch):
    """`--via-mcp --embedder NAME` starts each server with AMFS_EMBEDDER=NAME (a fetched model's cache travels with
    it); a model file cannot be handed to a server, so it is refused before anything runs."""
    from contextlib import asynccontextmanager

    from amfs_server.session_bench import mcp_latency

    started: list[dict[str, str]] = []

    class Stop(Exception):
        pass

    @asynccontextmanager
    async def recording_session(env):
        started.append(env)
        raise Stop
        yield  # pragma: no cover - never reached

    monkeypatch.setattr(mcp_latency, "stdio_session", recording_session)
    monkeypatch.setenv("AMFS_MODEL_CACHE", "/models/here")
    monkeypatch.setenv("AMFS_DATA_DIR", "/not/for/the/bench")
    conversation = gen.build_dataset(seed=5, conversations=1, sessions=2)["conversations"][0]
    with pytest.raises(Stop):
        asyncio.run(bench.run_via_mcp([conversation], embedder="embeddinggemma"))
    assert started[0]["AMFS_EMBEDDER"] == "embeddinggemma"
    assert started[0]["AMFS_MODEL_CACHE"] == "/models/here" and started[0]["AMFS_DATA_DIR"] != "/not/for/the/bench"
    with pytest.raises(SystemExit):
        bench.main(["--via-mcp", "--embedder", "/tmp/candidate/model_int8.onnx", "--conversations", "1"])


def test_rankers_runs_only_the_rankers_named_and_refuses_an_unknown_one(tmp_path, capsys):
    data = gen.build_dataset(seed=7, conversations=1, sessions=3)
    data["conversations"][0]["questions"] = data["conversations"][0]["questions"][:6]
    dataset = tmp_path / "tiny.json"
    dataset.write_text(json.dumps(data))
    report = bench.main(["--dataset", str(dataset), "--split", "all", "--embedder", "chat-minilm",
                         "--rankers", "fusion, bm25"])
    assert set(report["runs"]["sqlite"]["questions"]) == {bench.FUSION, bench.BM25_ROW}
    assert all(len(rows) == 6 for rows in report["runs"]["sqlite"]["questions"].values())
    with pytest.raises(SystemExit):
        bench.main(["--dataset", str(dataset), "--split", "all", "--rankers", "fusion,cosine"])
    assert "--rankers takes names of fusion, speaker, rrf, bm25, semantic" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--dataset", str(dataset), "--split", "all", "--rankers", "fusion", "--via-mcp"])
    assert "--rankers runs in process" in capsys.readouterr().err


def test_stores_postgres_without_a_server_is_refused_before_any_conversation_runs(monkeypatch, capsys):
    monkeypatch.setenv("AMFS_POSTGRES_DSN", "postgresql://postgres:hunter2@127.0.0.1:1/test")
    with pytest.raises(SystemExit):
        bench.main(["--split", "tuning", "--conversations", "1", "--stores", "sqlite,postgres"])
    err = capsys.readouterr().err
    assert "--stores postgres: cannot connect to PostgreSQL at postgresql://postgres@127.0.0.1:1/test" in err
    assert "hunter2" not in err and "[conversations/sqlite]" not in err


def test_via_mcp_with_dates_sends_each_turns_session_date_as_event_at(monkeypatch):
    """The slow protocol test above cannot tell a dropped `event_at` when dates move none of its 8 questions; this
    one reads what `amfs_write` was sent."""
    from contextlib import asynccontextmanager

    from amfs_server.session_bench import mcp_latency

    sent: list[dict] = []

    class Stop(Exception):
        pass

    class Session:
        async def call_tool(self, name, arguments):
            sent.append(arguments)
            raise Stop

    @asynccontextmanager
    async def recording_session(env):
        yield Session()

    monkeypatch.setattr(mcp_latency, "stdio_session", recording_session)
    conversation = gen.build_dataset(seed=5, conversations=1, sessions=2)["conversations"][0]
    first = conversation["sessions"][0]["turns"][0]
    for with_dates in (True, False):
        with pytest.raises(Stop):
            asyncio.run(bench.run_via_mcp([conversation], with_dates=with_dates))
    assert sent[0]["key"] == first["key"] and sent[0]["event_at"] == first["date"]
    assert "event_at" not in sent[1]


def test_server_path_runs_that_releases_server_and_its_older_results_are_read(monkeypatch):
    """`--server-path` (another release's server over MCP, e.g. 0.2.0, whose figures the retrieval issue quotes) puts
    that package first on the server's PYTHONPATH, and 0.2.0's results (the whole entry, no `entry_key`) are read as
    the compact ones are."""
    from contextlib import asynccontextmanager
    from types import SimpleNamespace

    from amfs_server.session_bench import mcp_latency

    conversation = gen.build_dataset(seed=5, conversations=1, sessions=2)["conversations"][0]
    path = conversation["conversation_id"]
    keys = [turn["key"] for turn in bench.turns_of(conversation)]
    first = conversation["questions"][0]
    answer = first["evidence"][0]  # what the older server answers every question with, first
    envs: list[dict] = []

    class Session:
        async def call_tool(self, name, arguments):
            if name == "amfs_write":
                return SimpleNamespace(is_error=False)
            old = {"results": [{"rank": 1, "score": 0.9, "entry": {"entity_path": path, "key": answer}},
                               {"rank": 2, "score": 0.5, "entry": {"entity_path": path, "key": keys[0]}}]}
            compact = {"results": [{"entry_key": f"{path}/{keys[1]}"}]}
            return SimpleNamespace(is_error=False, structured_content=old if envs[-1].get("PYTHONPATH") else compact)

    @asynccontextmanager
    async def recording_session(env):
        envs.append(env)
        yield Session()

    monkeypatch.setattr(mcp_latency, "stdio_session", recording_session)
    monkeypatch.setenv("PYTHONPATH", "/somewhere/else")
    old = asyncio.run(bench.run_via_mcp([conversation], server_path=Path("/releases/v020")))[bench.FUSION + " via MCP"]
    assert envs[-1]["PYTHONPATH"].split(os.pathsep) == ["/releases/v020", "/somewhere/else"]
    monkeypatch.delenv("PYTHONPATH")
    current = asyncio.run(bench.run_via_mcp([conversation]))[bench.FUSION + " via MCP"]
    assert "PYTHONPATH" not in envs[-1]
    by_id = {row["id"]: row for row in old}
    assert by_id[first["id"]]["mrr@10"] == 1.0  # the older shape's first hit read as the evidence turn it names
    assert by_id[first["id"]] == {**by_id[first["id"]], **bench.score_question([answer, keys[0]], first["evidence"])}
    assert len(old) == len(current) == len(conversation["questions"])
    assert bench.hit_key({"entry_key": f"{path}/{keys[1]}"}, path) == keys[1]
    assert bench.hit_key({"entry": {"entity_path": path, "key": keys[2]}}, path) == keys[2]


def test_server_path_without_a_package_there_is_refused_with_the_unpack_command(tmp_path, capsys):
    with pytest.raises(SystemExit):
        bench.main(["--via-mcp", "--server-path", str(tmp_path), "--split", "test"])
    assert "git archive REF | tar -x" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--server-path", str(tmp_path)])
    assert "add --via-mcp" in capsys.readouterr().err
