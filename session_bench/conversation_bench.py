"""Conversational retrieval benchmark: multi-session chats written turn by turn, questions asked with amfs_retrieve.

For each conversation of `data/conversations_eval.json` (see `make_conversation_dataset.py`): a fresh store,
every turn written one at a time in order (entity_path = the conversation id, key = the turn key, value =
"Speaker: text", as `amfs_write` does), then every question retrieved with entity_path and limit 10 and
scored against its evidence turns: recall@10 (the fraction of the evidence in the top 10) and MRR@10.

Rows: the fusion as configured (the default weights), each single strategy (`weights={name: 1.0}`), and a
plain Okapi BM25 over the conversation's turn values computed here, so the simple baseline is always printed
beside ours. `--via-mcp` runs the fusion through the real MCP client against `amfs-server` over stdio, on
each store of `--stores` (PostgreSQL: a fresh schema per conversation, dropped after).

The unit everything calls is a *ranker*: `async (service, conversation, questions) -> [[turn key, ...], ...]`
(one ranked list per question, best first). A new stage is a new ranker added to `rankers()`.

    amfs-server bench retrieval conversations --split tuning
    amfs-server bench retrieval conversations --split test --stores sqlite,postgres --json out.json
    amfs-server bench retrieval conversations --split tuning --conversations 1 --via-mcp --stores sqlite,postgres
    amfs-server bench retrieval conversations --split tuning --with-dates   # each turn's date as event_at
    amfs-server bench retrieval conversations --split test --one-store      # every conversation in one store
    amfs-server bench retrieval conversations --split test --one-store --via-mcp   # ... in one server
    amfs-server bench retrieval conversations --split all --embedder all-mpnet-base-v2   # the [mpnet] extra
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import re
import statistics
import tempfile
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from ..core.embedding import DEFAULT_EMBEDDER
from ..core.models import Actor
from ..core.service import MemoryService, ServiceConfig, WriteRequest
from . import (SINGLE_STRATEGIES, add_query_encoder_option, alone, close_store, drop_schema, embedder_option, log,
               open_store, postgres_dsn, postgres_problem, pyplot, schema_dsn)

DATASET = Path(__file__).parent / "data" / "conversations_eval.json"
SPLITS = ("tuning", "test", "all")
LIMIT = 10
FUSION = "fusion (as configured)"
SEED_RRF = "rrf 0.4/0.2/0.2/0.2 (the seed's fusion)"
WITH_SPEAKER = "fusion with the speaker rule on"
BM25_ROW = "bm25 (baseline)"
METRICS = ("recall@10", "mrr@10")

Ranker = Callable[[Any, dict[str, Any], list[dict[str, Any]]], Awaitable[list[list[str]]]]


# -- the data -----------------------------------------------------------------------------------------------


def load_conversations(path: Path = DATASET, split: str = "all") -> list[dict[str, Any]]:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run python session_bench/make_conversation_dataset.py")
    conversations = json.loads(path.read_text())["conversations"]
    return [c for c in conversations if split == "all" or c["split"] == split]


def turns_of(conversation: dict[str, Any]) -> list[dict[str, Any]]:
    return [turn for session in conversation["sessions"] for turn in session["turns"]]


def turn_value(turn: dict[str, Any]) -> str:
    return f"{turn['speaker']}: {turn['text']}"


# -- scoring ------------------------------------------------------------------------------------------------


def score_question(ranked: Sequence[str], evidence: Sequence[str], k: int = LIMIT) -> dict[str, float]:
    """recall@k: the fraction of the evidence in the top k; MRR@k: 1/rank of the first evidence turn in the top k."""
    gold = set(evidence)
    if not gold:
        raise ValueError("a question needs at least one evidence turn")
    top = list(ranked[:k])
    first = next((rank for rank, key in enumerate(top, start=1) if key in gold), None)
    return {"recall@10": len(gold & set(top)) / len(gold), "mrr@10": 1.0 / first if first else 0.0}


def mean_scores(rows: Sequence[dict[str, float]]) -> dict[str, float]:
    return {m: statistics.fmean(r[m] for r in rows) for m in METRICS} | {"n": len(rows)}


# -- the BM25 baseline --------------------------------------------------------------------------------------


def tokens(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


class BM25:
    """Okapi BM25 (k1=1.2, b=0.75) over lowercase word tokens; idf = ln(1 + (N - df + 0.5) / (df + 0.5))."""

    def __init__(self, documents: dict[str, str], k1: float = 1.2, b: float = 0.75) -> None:
        self.k1, self.b = k1, b
        self.keys = list(documents)
        self.counts = [Counter(tokens(documents[key])) for key in self.keys]
        self.lengths = [sum(c.values()) for c in self.counts]
        self.average = statistics.fmean(self.lengths) if self.lengths else 0.0
        df = Counter(word for c in self.counts for word in c)
        n = len(self.keys)
        self.idf = {word: math.log(1 + (n - f + 0.5) / (f + 0.5)) for word, f in df.items()}

    def rank(self, query: str, limit: int = LIMIT) -> list[str]:
        words = [w for w in set(tokens(query)) if w in self.idf]
        scored = []
        for index, counts in enumerate(self.counts):
            norm = self.k1 * (1 - self.b + self.b * self.lengths[index] / self.average)
            score = sum(self.idf[w] * counts[w] * (self.k1 + 1) / (counts[w] + norm) for w in words if w in counts)
            if score > 0:
                scored.append((-score, index))
        return [self.keys[index] for _, index in sorted(scored)[:limit]]


async def bm25_ranker(service: Any, conversation: dict[str, Any], questions: list[dict[str, Any]]) -> list[list[str]]:
    index = BM25({turn["key"]: turn_value(turn) for turn in turns_of(conversation)})
    return [index.rank(question["question"]) for question in questions]


# -- rankers through MemoryService ----------------------------------------------------------------------------


WRITE_ORDERS = ("given", "runs-of-8", "shuffled")


def write_order(turns: list[dict[str, Any]], order: str, seed: int = 7) -> list[dict[str, Any]]:
    """The turns in the order a client writes them: as given, each run of 8 shuffled (8 writes in flight), or all
    shuffled; the stress for the context passage, which pairs a turn with the one written just before it."""
    rng = random.Random(seed)
    if order == "runs-of-8":
        runs = [turns[start:start + 8] for start in range(0, len(turns), 8)]
        return [turn for run in runs for turn in rng.sample(run, len(run))]
    if order == "shuffled":
        return rng.sample(turns, len(turns))
    return turns


async def write_conversation(service: MemoryService, conversation: dict[str, Any], with_dates: bool = False,
                             order: str = "given") -> None:
    """Every turn as one memory, one write at a time, as a client calling amfs_write per turn would; in order
    unless `order` says otherwise (`write_order`).

    `with_dates` passes each turn's session date as its `event_at` (the held-out protocol, as the issue describes
    it, passes none; a client that records when things happened would)."""
    actor = Actor("bench/conversation", conversation["conversation_id"])
    for turn in write_order(turns_of(conversation), order):
        await service.write(actor, WriteRequest(
            conversation["conversation_id"], turn["key"], turn_value(turn),
            event_at=turn["date"] if with_dates else None))


def service_ranker(weights: dict[str, float] | None, fusion: str | None = None) -> Ranker:
    """Ranks with `service.retrieve` scoped to the conversation; `weights` and `fusion` None: as configured."""

    async def rank(service: MemoryService, conversation: dict[str, Any], questions: list[dict[str, Any]]) -> list[list[str]]:
        actor = Actor("bench/conversation", f"{conversation['conversation_id']}-questions")
        ranked = []
        for question in questions:
            results = await service.retrieve(
                actor, question["question"], entity_path=conversation["conversation_id"], limit=LIMIT, weights=weights,
                fusion=fusion,
            )
            ranked.append([hit.entry.key for hit in results])
        return ranked

    return rank


def rankers() -> dict[str, Ranker]:
    from ..core.retrieval import SPEAKER_WEIGHT

    table: dict[str, Ranker] = {FUSION: service_ranker(None), WITH_SPEAKER: service_ranker({"speaker": SPEAKER_WEIGHT}),
                                SEED_RRF: service_ranker(None, fusion="rrf")}
    for name in SINGLE_STRATEGIES:
        table[name] = service_ranker(alone(name))
    table[BM25_ROW] = bm25_ranker
    return table


# --rankers' short names for the rows of `rankers()`
RANKER_NAMES = {"fusion": FUSION, "speaker": WITH_SPEAKER, "rrf": SEED_RRF, "bm25": BM25_ROW,
                **{name: name for name in SINGLE_STRATEGIES}}


def reattribute_evidence(conversations: list[dict[str, Any]], share: float, seed: int = 11) -> int:
    """Give `share` of the evidence turns (seeded) to the conversation's other speaker, in place; returns how many.

    In this data set every question that names a person is answered by that person's own turns, which flatters
    the speaker rule; real conversations also answer from what the other person said."""
    rng = random.Random(seed)
    moved = 0
    for conversation in conversations:
        turns = {turn["key"]: turn for turn in turns_of(conversation)}
        speakers = sorted({turn["speaker"] for turn in turns.values()})
        for key in sorted({key for q in conversation["questions"] for key in q["evidence"]}):
            if len(speakers) == 2 and rng.random() < share:
                turn = turns[key]
                turn["speaker"] = speakers[1 - speakers.index(turn["speaker"])]
                moved += 1
    return moved


def score_conversation(conversation: dict[str, Any], ranked: list[list[str]]) -> list[dict[str, Any]]:
    return [
        {"id": q["id"], "conversation": conversation["conversation_id"], "kind": q["kind"], "split": conversation["split"],
         **score_question(r, q["evidence"])}
        for q, r in zip(conversation["questions"], ranked, strict=True)
    ]


# -- runs -------------------------------------------------------------------------------------------------------


async def run_in_process(conversations: list[dict[str, Any]], store_kind: str, embedder=None,
                         selected: dict[str, Ranker] | None = None,
                         with_dates: bool = False, one_store: bool = False,
                         order: str = "given", also: dict[str, Any] | None = None) -> dict[str, list[dict[str, Any]]]:
    """Per ranker, one scored row per question over all `conversations` (each on a fresh `store_kind` store, or
    with `one_store` all written into one store first, as one server would hold them; questions stay scoped).

    `also` maps a label to another embedder of the same stored vectors (another question side): every ranker asks
    the same store again through it, its rows under `ranker @label`, so the two sides pair question by question.
    The first pass's reads are counted before the second asks; on a store written minutes before, that moves no
    ranking (`test_a_second_question_side_asks_the_same_store_and_pairs_question_by_question`)."""
    from ..adapters.embedders import load_embedder

    embedder = embedder or load_embedder()
    selected = selected or rankers()
    also = also or {}
    if any((other.name, other.dimension) != (embedder.name, embedder.dimension) for other in also.values()):
        raise ValueError("a second question side must ask over the same stored vectors (the same embedder name)")
    rows: dict[str, list[dict[str, Any]]] = {f"{name}{suffix}": [] for suffix in ["", *(f" @{label}" for label in also)]
                                              for name in selected}
    groups = [conversations] if one_store else [[conversation] for conversation in conversations]
    with tempfile.TemporaryDirectory(prefix="amfs-conv-bench-") as tmp:
        for number, group in enumerate(groups, start=1):
            log(f"[conversations/{store_kind}] store {number}/{len(groups)}: "
                f"{', '.join(c['conversation_id'] for c in group)} ({sum(len(turns_of(c)) for c in group)} turns, "
                f"{sum(len(c['questions']) for c in group)} questions)")
            store = await open_store(store_kind, Path(tmp), embedder.dimension)
            try:
                service = MemoryService(store, ServiceConfig(), embedder=embedder)
                await service.open()
                for conversation in group:
                    await write_conversation(service, conversation, with_dates, order)
                for suffix, asking in [("", embedder), *((f" @{label}", other) for label, other in also.items())]:
                    service.embedder = asking  # what embeds the questions; the stored vectors stay as written
                    for conversation in group:  # asked once every conversation of the store is in
                        for name, ranker in selected.items():
                            ranked = await ranker(service, conversation, conversation["questions"])
                            rows[name + suffix] += score_conversation(conversation, ranked)
            finally:
                await close_store(store)
    return rows


async def mcp_fusion_ranker(session: Any, conversation: dict[str, Any], questions: list[dict[str, Any]]) -> list[list[str]]:
    """The held-out protocol: amfs_retrieve with entity_path and limit 10 through an MCP client session."""
    ranked = []
    for question in questions:
        result = await session.call_tool(
            "amfs_retrieve", {"query": question["question"], "entity_path": conversation["conversation_id"], "limit": LIMIT}
        )
        if result.is_error:
            raise RuntimeError(f"amfs_retrieve failed: {result.content[0].text}")
        payload = result.structured_content or json.loads(result.content[0].text)
        ranked.append([hit_key(hit, conversation["conversation_id"]) for hit in payload["results"]])
    return ranked


def hit_key(hit: dict[str, Any], entity_path: str) -> str:
    """The turn key of one `amfs_retrieve` result: compact hits (0.3.0 on) name the entry as "entity_path/key";
    0.2.0's carry the whole entry (`--server-path` runs such a release)."""
    if "entry_key" in hit:
        return str(hit["entry_key"]).removeprefix(entity_path + "/")
    return str(hit["entry"]["key"])


async def run_via_mcp(conversations: list[dict[str, Any]], store: str = "sqlite",
                      one_store: bool = False, embedder: str | None = None,
                      query_encoder: str = "auto", with_dates: bool = False,
                      server_path: Path | None = None) -> dict[str, list[dict[str, Any]]]:
    """The fusion through `amfs-server` over stdio, next to BM25: a fresh server per conversation (with `one_store`,
    one server holding every conversation, each question scoped to its own), on a fresh SQLite file or, with `store`
    "postgres", in a fresh schema of the benchmarks' PostgreSQL database (dropped after); `embedder` and
    `query_encoder` are the server's AMFS_EMBEDDER (default: its default) and AMFS_QUERY_ENCODER; `with_dates`
    passes each turn's session date as `amfs_write`'s `event_at`, as `write_conversation` does in process;
    `server_path`, a folder holding another release's `amfs_server` package, runs that release's server (first on
    its PYTHONPATH) instead of this one."""
    from .mcp_latency import server_env, stdio_session

    rows: dict[str, list[dict[str, Any]]] = {FUSION + " via MCP": [], BM25_ROW: []}
    groups = [conversations] if one_store else [[conversation] for conversation in conversations]
    with tempfile.TemporaryDirectory(prefix="amfs-conv-mcp-") as tmp:
        for number, group in enumerate(groups, start=1):
            log(f"[conversations/mcp/{store}] server {number}/{len(groups)}: "
                f"{', '.join(c['conversation_id'] for c in group)}")
            schema = f"amfs_bench_mcp_{uuid.uuid4().hex[:8]}"
            extra = {"AMFS_POSTGRES_DSN": schema_dsn(postgres_dsn(), schema)} if store == "postgres" else {}
            if embedder is not None:
                extra["AMFS_EMBEDDER"] = embedder
            extra["AMFS_QUERY_ENCODER"] = query_encoder
            if server_path is not None:
                extra["PYTHONPATH"] = os.pathsep.join(
                    filter(None, [str(server_path.resolve()), os.environ.get("PYTHONPATH")]))
            try:
                async with stdio_session(server_env(Path(tmp) / f"server-{number}", **extra)) as session:
                    for conversation in group:
                        for turn in turns_of(conversation):
                            result = await session.call_tool("amfs_write", {
                                "entity_path": conversation["conversation_id"], "key": turn["key"],
                                "value": turn_value(turn), **({"event_at": turn["date"]} if with_dates else {})})
                            if result.is_error:
                                raise RuntimeError(f"amfs_write failed: {result.content[0].text}")
                    ranked = [await mcp_fusion_ranker(session, c, c["questions"]) for c in group]
            finally:
                if store == "postgres":
                    await drop_schema(postgres_dsn(), schema)
            for conversation, answers in zip(group, ranked):
                rows[FUSION + " via MCP"] += score_conversation(conversation, answers)
                rows[BM25_ROW] += score_conversation(
                    conversation, await bm25_ranker(None, conversation, conversation["questions"]))
    return rows


# -- the report ---------------------------------------------------------------------------------------------------


def summarise(rows: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per ranker: per split, then overall and per question kind."""
    summary: dict[str, Any] = {}
    for name, scored in rows.items():
        per_split: dict[str, Any] = {}
        for split in sorted({r["split"] for r in scored}, key=SPLITS.index):
            chosen = [r for r in scored if r["split"] == split]
            per_split[split] = {"overall": mean_scores(chosen),
                                "by_kind": {k: mean_scores([r for r in chosen if r["kind"] == k])
                                            for k in sorted({r["kind"] for r in chosen})}}
        summary[name] = per_split
    return summary


def markdown(summary: dict[str, Any], store: str) -> str:
    lines = []
    splits = sorted({s for per in summary.values() for s in per}, key=SPLITS.index)
    for split in splits:
        kinds = sorted({k for per in summary.values() if split in per for k in per[split]["by_kind"]})
        n = next(per[split]["overall"]["n"] for per in summary.values() if split in per)
        lines += [f"### {store}, {split} split ({n} questions): recall@10 / MRR@10", "",
                  "| ranker | overall | " + " | ".join(kinds) + " |", "| --- | --- |" + " --- |" * len(kinds)]
        for name, per in summary.items():
            if split not in per:
                continue
            cells = [_cell(per[split]["overall"])] + [_cell(per[split]["by_kind"][k]) if k in per[split]["by_kind"] else "-"
                                                      for k in kinds]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


# Rankers drawn by `plot` (temporal and confidence alone equal semantic on this set: every turn was written in one
# hour with confidence 1).
PLOTTED = (FUSION, WITH_SPEAKER, SEED_RRF, "semantic", "keyword", BM25_ROW)


def plot(summary: dict[str, Any], title: str, path: Path) -> None:
    """recall@10 per question kind and overall, one group of bars per kind, one bar per ranker, one panel per split."""
    plt = pyplot()
    splits = sorted({s for per in summary.values() for s in per}, key=SPLITS.index)
    names = [name for name in PLOTTED if name in summary]
    fig, axes = plt.subplots(1, len(splits), figsize=(6.5 * len(splits), 4.8), squeeze=False, sharey=True)
    for ax, split in zip(axes[0], splits):
        kinds = sorted({k for per in summary.values() if split in per for k in per[split]["by_kind"]})
        groups = ["overall", *kinds]
        width = 0.8 / len(names)
        for i, name in enumerate(names):
            per = summary[name].get(split)
            if per is None:
                continue
            values = [per["overall"]["recall@10"]] + [per["by_kind"].get(k, {}).get("recall@10", 0.0) for k in kinds]
            ax.bar([g + (i - (len(names) - 1) / 2) * width for g in range(len(groups))], values, width, label=name)
        n = next(per[split]["overall"]["n"] for per in summary.values() if split in per)
        ax.set_xticks(range(len(groups)), groups)
        ax.set_title(f"{title}, {split} split ({n} questions)")
        ax.set_ylim(0, 1)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("recall@10")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.1, 1, 1))  # room below the panels for the legend
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _cell(scores: dict[str, float]) -> str:
    return f"{scores['recall@10']:.3f} / {scores['mrr@10']:.3f}"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="amfs-server bench retrieval conversations", description=__doc__.splitlines()[0])
    parser.add_argument("--split", choices=SPLITS, default="tuning",
                        help="tuning (tune on it), test (report on it) or all (default: tuning)")
    parser.add_argument("--stores", default="sqlite", help="comma-separated: sqlite, postgres (default: sqlite)")
    parser.add_argument("--via-mcp", action="store_true",
                        help="the fusion through amfs-server over stdio, on each of --stores")
    parser.add_argument("--conversations", type=int, default=None, help="only the first N conversations of the split")
    parser.add_argument("--dataset", type=Path, default=DATASET)
    parser.add_argument("--json", type=Path, default=None, help="also write the summary (and per-question scores) here")
    parser.add_argument("--plot", type=Path, default=None,
                        help="also draw recall@10 per question kind of the first store's run here (PNG; needs the "
                             "[bench] extra)")
    parser.add_argument("--embedder", default=None,
                        help="the embedder to use, by name (e.g. embeddinggemma; with --via-mcp the server's "
                             "AMFS_EMBEDDER) or, in process only, a candidate model: an exported ONNX file "
                             "(PATH.onnx[.gz]) or a folder scripts/finetune_embedder.py wrote (default: the "
                             "server's default)")
    add_query_encoder_option(parser)
    from ..adapters.embedders import QUERY_ENCODERS

    parser.add_argument("--also-query-encoder", default=None, choices=QUERY_ENCODERS,
                        help="in process: ask each store again with this question side (an AMFS_QUERY_ENCODER value), "
                             "every ranker's rows under 'RANKER @ENCODER', paired with --query-encoder's by question "
                             "(`intervals X.json` compares them); the turns are written once")
    parser.add_argument("--with-dates", action="store_true",
                        help="write each turn with its session date as event_at (in process or --via-mcp; the "
                             "held-out protocol, as the retrieval issue describes it, passes no dates)")
    parser.add_argument("--reattribute-evidence", type=float, default=0.0, metavar="SHARE",
                        help="give this share (0-1) of the evidence turns to the other speaker: the speaker rule's "
                             "stress test (default 0)")
    parser.add_argument("--one-store", action="store_true",
                        help="write every conversation into one store before asking, as one server holding them all "
                             "would (with --via-mcp: one server); each question stays scoped to its conversation")
    parser.add_argument("--write-order", choices=WRITE_ORDERS, default="given",
                        help="the order each conversation's turns are written in (in-process only; seed 7): as "
                             "given, each run of 8 shuffled, or all shuffled (default: given)")
    parser.add_argument("--server-path", type=Path, default=None, metavar="DIR",
                        help="with --via-mcp: run the server of the amfs_server package in DIR (another release, e.g. "
                             "unpacked by `git archive REF | tar -x -C DIR/amfs_server`) instead of this one; the "
                             "client, the scoring and BM25 stay this release's")
    parser.add_argument("--rankers", default=None, metavar="NAMES",
                        help="in process: only these rankers, comma-separated, of " + ", ".join(RANKER_NAMES)
                             + " (default: all; each asks every question again, so fewer run faster)")
    args = parser.parse_args(argv)
    selected = None
    if args.rankers is not None:
        names = [name.strip() for name in args.rankers.split(",") if name.strip()]
        unknown_rankers = [name for name in names if name not in RANKER_NAMES]
        if unknown_rankers or not names:
            parser.error(f"--rankers takes names of {', '.join(RANKER_NAMES)}; got {args.rankers!r}")
        if args.via_mcp:
            parser.error("--rankers runs in process (over MCP the fusion and BM25 run); drop --via-mcp")
        every = rankers()
        selected = {RANKER_NAMES[name]: every[RANKER_NAMES[name]] for name in names}
    if args.server_path is not None:
        if not args.via_mcp:
            parser.error("--server-path runs another release's server over MCP; add --via-mcp")
        if not (args.server_path / "amfs_server" / "__init__.py").is_file():
            parser.error(f"--server-path {args.server_path}: no amfs_server package there (expected "
                         f"{args.server_path / 'amfs_server' / '__init__.py'}); unpack a release with "
                         f"`mkdir -p {args.server_path}/amfs_server && git archive REF | tar -x -C "
                         f"{args.server_path}/amfs_server`")
    if args.write_order != "given" and args.via_mcp:
        parser.error("--write-order runs in process; drop --via-mcp")
    if not 0.0 <= args.reattribute_evidence <= 1.0:
        parser.error(f"--reattribute-evidence takes a share between 0 and 1, got {args.reattribute_evidence}")
    if args.also_query_encoder is not None and args.via_mcp:
        parser.error("--also-query-encoder runs in process; drop --via-mcp")
    if args.via_mcp and args.embedder and (args.embedder.endswith((".onnx", ".onnx.gz")) or Path(args.embedder).is_dir()):
        parser.error("--via-mcp takes an embedder by name (the server's AMFS_EMBEDDER), not a model file or folder")
    stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    unknown = set(stores) - {"sqlite", "postgres"}
    if unknown or not stores:
        parser.error(f"--stores takes sqlite and/or postgres, got {args.stores!r}")
    if "postgres" in stores and (problem := asyncio.run(postgres_problem(postgres_dsn()))):
        parser.error(f"--stores postgres: {problem}")  # before the SQLite half has run for minutes
    if args.conversations is not None and args.conversations < 1:
        parser.error("--conversations must be at least 1")
    conversations = load_conversations(args.dataset, args.split)[: args.conversations]
    if not conversations:
        held = sorted({c["split"] for c in load_conversations(args.dataset)}, key=SPLITS.index)
        parser.error(f"{args.dataset} has no conversations in the {args.split} split; its splits: {', '.join(held)}"
                     " (--split all takes every conversation)")
    if args.reattribute_evidence:
        moved = reattribute_evidence(conversations, args.reattribute_evidence)
        log(f"[conversations] {moved} evidence turns re-attributed to the other speaker")
    report: dict[str, Any] = {"split": args.split, "with_dates": args.with_dates, "write_order": args.write_order, "conversations": [c["conversation_id"] for c in conversations],
                              "questions": sum(len(c["questions"]) for c in conversations),
                              "query_encoder": args.query_encoder,
                              "server_path": None if args.server_path is None else str(args.server_path), "runs": {}}
    texts = []
    if args.via_mcp:
        for store in stores:
            rows = asyncio.run(run_via_mcp(conversations, store, one_store=args.one_store, embedder=args.embedder,
                                           query_encoder=args.query_encoder, with_dates=args.with_dates,
                                           server_path=args.server_path))
            run = "mcp-stdio" if store == "sqlite" else f"mcp-stdio-{store}"
            report["runs"][run] = {"summary": summarise(rows), "questions": rows}
            texts.append(markdown(report["runs"][run]["summary"],
                                  f"amfs-server over MCP stdio ({'SQLite' if store == 'sqlite' else 'PostgreSQL'})"
                                  + (", every conversation in one server" if args.one_store else "")
                                  + (f", the server from {args.server_path}" if args.server_path else "")))
    else:
        embedder = embedder_option(parser, args.embedder, args.query_encoder)
        also = ({args.also_query_encoder: embedder_option(parser, args.embedder, args.also_query_encoder)}
                if args.also_query_encoder is not None else {})
        report["embedder"] = embedder.name if embedder is not None else DEFAULT_EMBEDDER
        from ..adapters.embedders import question_side

        report["question_side"] = question_side(embedder)
        if also:
            report["also_query_encoder"] = args.also_query_encoder
            report["also_question_side"] = question_side(also[args.also_query_encoder])
        for store in stores:
            rows = asyncio.run(run_in_process(conversations, store, embedder=embedder, selected=selected,
                                              with_dates=args.with_dates, one_store=args.one_store,
                                              order=args.write_order, also=also))
            report["runs"][store] = {"summary": summarise(rows), "questions": rows}
            texts.append(markdown(report["runs"][store]["summary"], store + (" with dates" if args.with_dates else "")
                                  + (", every conversation in one store" if args.one_store else "")
                                  + (f", turns written {args.write_order}" if args.write_order != "given" else "")))
    text = "\n".join(texts)
    print(text)
    if args.plot is not None:
        first = next(iter(report["runs"]))
        plot(report["runs"][first]["summary"], "mcp stdio" if first == "mcp-stdio" else first, args.plot)
        log(f"wrote {args.plot}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n")
        log(f"wrote {args.json}")
    return report


if __name__ == "__main__":
    main()
