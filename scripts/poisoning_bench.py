"""Retrieval poisoning: how far a writer into a conversation's entity path crowds its questions' top tens.

One target conversation (default ann-05 of the annotated set) is written turn by turn into a fresh store, in process
on the real `MemoryService` with the default embedder (as `amfs-server bench retrieval conversations` does), then
attack memories are written into the same entity path through the service's normal write API, and every question of
the target is asked scoped to that path with `limit` 10. Each scenario starts from a fresh store; the embeddings of
the turns and questions are computed once and reused (the same batches, so the same vectors).

Attacks, all built deterministically and never from the target's questions for the hubs:

* hubs (`--hubs 1,10`): memories of about `--hub-words` words made of questions of OTHER conversations, the target's
  two speaker names swapped in for their own. The questions are chosen greedily on a selection conversation that is
  neither the target nor a source of questions (`--select-on`, default the first tuning conversation that is not
  the target): it is written into a store of its own, each of its questions asked once, and each hub grows by the
  candidate question (that conversation's speaker names swapped in) that makes the most of its questions' semantic
  scores beat their 10th best turn's. The hub's score for a question is estimated as the service computes it (half
  the entry vector's cosine, half the best passage's; the entry vector approximated by the mean of the hub's
  question embeddings); questions an earlier hub already reaches count half as much again for each such hub, so
  later hubs aim elsewhere. Candidate questions: the conversations of `--pool-split` (default tuning) other than
  the target and the selection conversation. The chosen questions are then written into the target with its names.
* near-copies (`--near-copies 60`): the target's questions in a seeded order (`--seed`), each taking its first
  evidence turn not faked yet (a question whose evidence is all faked already is passed over) until that many turns
  are faked: each copied with one fact changed by the rule of `scripts/near_copy_share.py` (a weekday, month,
  number or name swapped, else a sentence appended), written under a key of its own ("D3:7-b"). This one uses the
  target's evidence labels: it models a writer who knows what will be asked, as the red-team pass did.
* copies (`--copies 29`): that many memories all holding the first hub's text.

`--hub-form` writes a hub's questions otherwise (an attacker who knows a defence aimed at questions):
`flat` ('?' made '.'), `statements` (question word and auxiliary dropped), `grouped:K` (K questions a sentence),
`single` (one sentence). `--confidence` and `--event-at` give every attack memory that confidence / event time
(the write API's levers). Reported per scenario: recall@10 and MRR@10 over the target's questions against the clean run, how many top tens
the attack memories enter (any of them, and each hub's own count), how many first places they take; for the
near-copies, of the questions whose evidence turn was faked, how often the fake is in the ten, above its real turn
(or the real turn missing) and first, and how many of the fakes returned beside their real turn are marked
`near_copies`.

    python scripts/poisoning_bench.py                                   # ann-05: hubs 1 and 10, 60 near-copies, 29 copies
    python scripts/poisoning_bench.py --confidence 1.5 --event-at 2200-01-01 --json /tmp/poison-levers.json
    python scripts/poisoning_bench.py --target ann-01 --hubs 1,10 --json /tmp/poison-ann01.json   # a tuning conversation
    python scripts/poisoning_bench.py --target ann-02 --attacks hubs --hubs 1,10,30 --hub-words 60 --hub-form statements

ann-05 is in the annotated TEST split: choose anything (a defence, its parameters) on the tuning conversations
(ann-01..04) and report ann-05 once; for ann-05 the hub questions come from ann-02..04 and are chosen on ann-01.
The default run took about 5 minutes on a busy 2-core machine (SQLite; `--stores postgres` uses
`AMFS_POSTGRES_DSN` as the other benchmarks do; not run here). No network, no GPU.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from amfs_server.core import service as service_module
from amfs_server.core.embedding import TURN_HEADER, embed_queries, embedding_text
from amfs_server.core.models import Actor
from amfs_server.core.retrieval import fuse_hybrid
from amfs_server.core.service import MemoryService, ServiceConfig, WriteRequest
from amfs_server.session_bench import close_store, open_store
from amfs_server.session_bench.conversation_bench import load_conversations, score_question, write_conversation

sys.path.insert(0, str(Path(__file__).resolve().parent))
from near_copy_share import altered  # noqa: E402  (the red team's way of changing one fact, one rule for both)

DATASET = Path(__file__).resolve().parents[1] / "session_bench" / "data" / "conversations_annotated.json"
LIMIT = 10
HUB_KEY = "D99:{}"  # looks like a turn id, so a hub is embedded under the turns' fixed header
COPY_KEY = "D98:{}"
FAKE_SUFFIX = "-b"  # a near-copy of turn "D3:7" is written as "D3:7-b"
ATTACKS = ("hubs", "near-copies", "copies")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- embeddings, once -----------------------------------------------------------------------------------------------


class CachedEmbedder:
    """The embedder with a memo per batch of texts: every scenario rewrites the same conversation, and an identical
    batch gives the identical vectors, so after the first scenario writes cost no model time."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name
        self.dimension = inner.dimension
        self._docs: dict[tuple[str, ...], np.ndarray] = {}
        self._queries: dict[tuple[str, ...], np.ndarray] = {}
        if hasattr(inner, "embed_query"):
            self.embed_query = self._embed_query

    def embed(self, texts):
        key = tuple(texts)
        if key not in self._docs:
            self._docs[key] = self.inner.embed(list(texts))
        return self._docs[key].copy()

    def _embed_query(self, texts):
        key = tuple(texts)
        if key not in self._queries:
            self._queries[key] = self.inner.embed_query(list(texts))
        return self._queries[key].copy()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


# -- building the attacks -------------------------------------------------------------------------------------------


def swap_speakers(text: str, source: list[str], target: list[str]) -> str:
    """`text` with the source conversation's speakers replaced by the target's (first for first), whole words."""
    marks = {f"\x00{i}\x00": name for i, name in enumerate(target)}
    for i, name in enumerate(source):
        text = re.sub(rf"\b{re.escape(name)}\b", f"\x00{i % len(target)}\x00", text)
    for mark, name in marks.items():
        text = text.replace(mark, name)
    return text


def words_of(text: str) -> int:
    return len(text.split())


class Recorder:
    """Stands in for `fuse_hybrid` inside the service and keeps the last call's semantic scores."""

    def __init__(self) -> None:
        self.semantic: list[float] = []

    def __call__(self, rankings, weights, pool=50):
        self.semantic = next((list(r.scores) for r in rankings if r.strategy == "semantic"), [])
        return fuse_hybrid(rankings, weights, pool)


async def tenth_semantic_scores(kind: str, workdir: Path, embedder: Any, conversation: dict[str, Any]) -> list[float]:
    """Per question of `conversation` (written into a fresh store), the semantic score its 10th candidate has."""
    recorder = Recorder()
    store = await open_store(kind, workdir, embedder.dimension)
    previous, service_module.fuse_hybrid = service_module.fuse_hybrid, recorder
    try:
        service = MemoryService(store, ServiceConfig(), embedder=embedder)
        await service.open()
        await write_conversation(service, conversation)
        actor = Actor("bench/poisoning", "selection")
        out = []
        for question in conversation["questions"]:
            await service.retrieve(actor, question["question"], entity_path=conversation["conversation_id"],
                                   limit=LIMIT, count_as_read=False)
            scores = sorted(recorder.semantic, reverse=True)
            out.append(scores[min(LIMIT, len(scores)) - 1] if scores else 0.0)
        return out
    finally:
        service_module.fuse_hybrid = previous
        await close_store(store)


def choose_hubs(candidates: list[str], passages: np.ndarray, questions: np.ndarray, thresholds: np.ndarray,
                hubs: int, hub_words: int, share: float = 0.5) -> list[list[int]]:
    """Greedy: each hub takes, one at a time, the candidate (index into `candidates`) that most raises the weighted
    count of selection questions whose estimated hub score beats their threshold, until it holds `hub_words` words.
    A question already reached by k earlier hubs weighs 0.5**k. Ties go to the earlier candidate."""
    sims = passages @ questions.T  # candidates x questions
    reached = np.zeros(len(questions))
    used: set[int] = set()
    chosen: list[list[int]] = []
    for _ in range(hubs):
        hub: list[int] = []
        total = np.zeros(passages.shape[1], dtype=np.float32)
        best_passage = np.full(len(questions), -1.0)
        words = 0
        weight = 0.5 ** reached
        while words < hub_words:
            free = np.array([i for i in range(len(candidates)) if i not in used])
            if free.size == 0:
                break
            means = total[None, :] + passages[free]
            means /= np.linalg.norm(means, axis=1, keepdims=True)
            estimate = (1 - share) * (means @ questions.T) + share * np.maximum(best_passage[None, :], sims[free])
            gain = ((estimate > thresholds[None, :]) * weight[None, :]).sum(axis=1)
            pick = int(free[int(np.argmax(gain))])
            hub.append(pick)
            used.add(pick)
            total += passages[pick]
            best_passage = np.maximum(best_passage, sims[pick])
            words += words_of(candidates[pick])
        mean = total / np.linalg.norm(total)
        final = (1 - share) * (questions @ mean) + share * best_passage
        reached += final > thresholds
        chosen.append(hub)
    return chosen


async def build_hubs(args: argparse.Namespace, embedder: Any, conversations: list[dict[str, Any]],
                     target: dict[str, Any], workdir: Path) -> tuple[list[str], dict[str, Any]]:
    """The hub texts (as many as the largest of `--hubs`) for `target`, and how they were chosen."""
    count = max(args.hubs)
    by_id = {c["conversation_id"]: c for c in conversations}
    select_id = args.select_on or next(c["conversation_id"] for c in conversations
                                       if c["split"] == "tuning" and c["conversation_id"] != target["conversation_id"])
    if select_id == target["conversation_id"] or select_id not in by_id:
        raise SystemExit(f"--select-on {select_id!r}: must be a conversation of the data set other than the target")
    selection = by_id[select_id]
    sources = [c for c in conversations if c["conversation_id"] not in (target["conversation_id"], select_id)
               and (args.pool_split == "all" or c["split"] == args.pool_split)]
    if not sources:
        raise SystemExit("no conversation left to take hub questions from (--pool-split)")
    seen: set[str] = set()
    originals: list[tuple[str, list[str]]] = []
    for conversation in sources:
        for question in conversation["questions"]:
            if question["question"] not in seen:
                seen.add(question["question"])
                originals.append((question["question"], conversation["speakers"]))
    log(f"hubs: {len(originals)} candidate questions from {', '.join(c['conversation_id'] for c in sources)}; "
        f"chosen greedily on {select_id}")
    label = selection["speakers"][0]
    for_selection = [swap_speakers(text, speakers, selection["speakers"]) for text, speakers in originals]
    passages = embedder.embed([embedding_text(TURN_HEADER, "", f"{label}: {text}") for text in for_selection])
    questions = embed_queries(embedder, [q["question"] for q in selection["questions"]])
    thresholds = np.array(await tenth_semantic_scores(args.stores[0], workdir, embedder, selection))
    chosen = choose_hubs(for_selection, passages, questions, thresholds, count, args.hub_words)
    texts = []
    for hub in chosen:
        body = hub_body([swap_speakers(originals[i][0], originals[i][1], target["speakers"]) for i in hub],
                        args.hub_form)
        texts.append(f"{target['speakers'][0]}: {body}")
    return texts, {"selected_on": select_id, "sources": [c["conversation_id"] for c in sources],
                   "candidates": len(originals), "questions_per_hub": [len(h) for h in chosen],
                   "words_per_hub": [words_of(t) for t in texts]}


_QUESTION_OPENING = re.compile(
    r"^(?:(?:what|which|whose|who|whom|why|where|when|how)(?: (?:many|much|long|often|old|far|kind of|sort of))?\s+"
    r"(?:(?:did|does|do|is|are|was|were|has|have|had|can|could|would|will|should)\s+)?"
    r"|(?:did|does|do|is|are|was|were|has|have|had|can|could|would|will|should)\s+)", re.IGNORECASE)


def hub_body(questions: list[str], form: str) -> str:
    """A hub's text from its questions: as asked (`questions`, one sentence each), with each '?' made a '.'
    (`flat`: no sentence ends like a question), as statements (`statements`: the question word and its auxiliary
    dropped, "What did Pen eat to test her taste?" -> "Pen eat to test her taste."), `grouped:K` (K questions to a
    sentence, joined by commas: fewer, blurrier passages) or `single` (one sentence: no passages, the entry vector
    alone)."""
    if form == "questions":
        return " ".join(questions)
    bare = [q.rstrip("?.! ") for q in questions]
    if form == "statements":
        stated = [_QUESTION_OPENING.sub("", q, count=1) for q in bare]
        return " ".join(q[:1].upper() + q[1:] + "." for q in stated if q)
    if form == "flat":
        return " ".join(q + "." for q in bare)
    size = len(bare) if form == "single" else int(form.split(":", 1)[1])
    return " ".join(", ".join(bare[i:i + size]) + "." for i in range(0, len(bare), size))


def build_near_copies(target: dict[str, Any], count: int, seed: int) -> list[dict[str, str]]:
    """Up to `count` questions of the target, in a seeded order, each with its first evidence turn that has not been
    faked yet (a question whose evidence is all faked already is passed over), copied with one fact changed;
    [{question id, real key, fake key, fake value}]."""
    turns = {turn["key"]: turn for session in target["sessions"] for turn in session["turns"]}
    questions = random.Random(seed).sample(target["questions"], len(target["questions"]))
    fakes: list[dict[str, str]] = []
    faked: set[str] = set()
    for question in questions:
        if len(fakes) == count:
            break
        key = next((k for k in question["evidence"] if k in turns and k not in faked), None)
        if key is None:
            continue
        faked.add(key)
        turn = turns[key]
        fakes.append({"question": question["id"], "real": key, "fake": key + FAKE_SUFFIX,
                      "value": f"{turn['speaker']}: {altered(turn['text'])}"})
    return fakes


# -- running a scenario ---------------------------------------------------------------------------------------------


async def run_scenario(kind: str, workdir: Path, embedder: Any, target: dict[str, Any],
                       attack: list[tuple[str, str]], confidence: float, event_at: str | None) -> list[dict[str, Any]]:
    """A fresh store with the target written, then `attack` ((key, value) in order) under its path; per question its
    ranked keys and which results were marked as near copies of which."""
    store = await open_store(kind, workdir, embedder.dimension)
    try:
        service = MemoryService(store, ServiceConfig(), embedder=embedder)
        await service.open()
        await write_conversation(service, target)
        path = target["conversation_id"]
        writer = Actor("bench/poisoning", "attacker")
        for key, value in attack:
            await service.write(writer, WriteRequest(path, key, value, confidence=confidence, event_at=event_at))
        actor = Actor("bench/poisoning", f"{path}-questions")
        out = []
        for question in target["questions"]:
            results = await service.retrieve(actor, question["question"], entity_path=path, limit=LIMIT)
            out.append({"id": question["id"], "ranked": [hit.entry.key for hit in results],
                        "marked": {hit.entry.key: [k.split("/", 1)[-1] for k in hit.near_copies]
                                   for hit in results if hit.near_copies}})
        return out
    finally:
        await close_store(store)


def summarise(target: dict[str, Any], rows: list[dict[str, Any]], attack_keys: list[str]) -> dict[str, Any]:
    scores = [score_question(row["ranked"], question["evidence"]) for row, question in zip(rows, target["questions"])]
    keys = set(attack_keys)
    per_key = {key: {"top10": sum(key in row["ranked"] for row in rows),
                     "first": sum(bool(row["ranked"]) and row["ranked"][0] == key for row in rows)}
               for key in attack_keys}
    return {"recall@10": sum(s["recall@10"] for s in scores) / len(scores),
            "mrr@10": sum(s["mrr@10"] for s in scores) / len(scores),
            "questions": len(scores),
            "top10_lists_with_attack": sum(bool(keys & set(row["ranked"])) for row in rows),
            "first_places": sum(bool(row["ranked"]) and row["ranked"][0] in keys for row in rows),
            "attack_slots": sum(len(keys & set(row["ranked"])) for row in rows),
            "per_memory": per_key}


def near_copy_outcomes(rows: list[dict[str, Any]], fakes: list[dict[str, str]]) -> dict[str, Any]:
    by_id = {row["id"]: row for row in rows}
    in_top = above = first = beside = marked = 0
    for fake in fakes:
        ranked = by_id[fake["question"]]["ranked"]
        if fake["fake"] not in ranked:
            continue
        in_top += 1
        at = ranked.index(fake["fake"])
        real_at = ranked.index(fake["real"]) if fake["real"] in ranked else LIMIT
        above += at < real_at
        first += at == 0
        if fake["real"] in ranked:
            beside += 1
            marked += fake["real"] in by_id[fake["question"]]["marked"].get(fake["fake"], [])
    return {"questions_faked": len(fakes), "fake_in_top10": in_top, "fake_above_real": above, "fake_first": first,
            "fake_beside_real": beside, "fake_beside_real_marked": marked}


# -- the run --------------------------------------------------------------------------------------------------------


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from amfs_server.adapters.embedders import load_embedder

    started = time.monotonic()
    conversations = load_conversations(args.dataset)
    by_id = {c["conversation_id"]: c for c in conversations}
    if args.target not in by_id:
        raise SystemExit(f"--target {args.target!r}: not in {args.dataset} ({', '.join(by_id)})")
    target = by_id[args.target]
    embedder = CachedEmbedder(load_embedder())
    report: dict[str, Any] = {"target": args.target, "split": target["split"], "dataset": str(args.dataset),
                              "hub_form": args.hub_form,
                              "confidence": args.confidence, "event_at": args.event_at, "seed": args.seed,
                              "stores": {}}
    with tempfile.TemporaryDirectory(prefix="amfs-poisoning-") as tmp:
        workdir = Path(tmp)
        scenarios: list[tuple[str, list[tuple[str, str]]]] = [("clean", [])]
        fakes: list[dict[str, str]] = []
        if "hubs" in args.attacks or "copies" in args.attacks:
            log("choosing hubs ...")
            hubs, how = await build_hubs(args, embedder, conversations, target, workdir)
            report["hubs"] = {**how, "texts": hubs}
            if "hubs" in args.attacks:
                for n in args.hubs:
                    scenarios.append((f"hubs x{n}", [(HUB_KEY.format(i + 1), hubs[i]) for i in range(n)]))
            if "copies" in args.attacks and args.copies:
                scenarios.append((f"copies x{args.copies}",
                                  [(COPY_KEY.format(i + 1), hubs[0]) for i in range(args.copies)]))
        if "near-copies" in args.attacks and args.near_copies:
            fakes = build_near_copies(target, args.near_copies, args.seed)
            report["near_copies"] = fakes
            scenarios.append((f"near-copies x{len(fakes)}", [(f["fake"], f["value"]) for f in fakes]))
        for kind in args.stores:
            results: dict[str, Any] = {}
            for name, attack in scenarios:
                log(f"{kind}: {name} ({len(attack)} attack memories) ... {time.monotonic() - started:.0f} s")
                rows = await run_scenario(kind, workdir, embedder, target, attack, args.confidence, args.event_at)
                summary = summarise(target, rows, [key for key, _ in dict(attack).items()])
                if name.startswith("near-copies"):
                    summary["near_copies"] = near_copy_outcomes(rows, fakes)
                results[name] = {**summary, "rows": rows if args.rows else None}
            report["stores"][kind] = results
    report["seconds"] = round(time.monotonic() - started, 1)
    return report


def print_table(report: dict[str, Any]) -> None:
    levers = f", confidence {report['confidence']}" + (f", event_at {report['event_at']}" if report["event_at"] else "")
    for kind, results in report["stores"].items():
        clean = results["clean"]
        print(f"\n{report['target']} ({report['split']} split, {clean['questions']} questions, {kind}{levers}):")
        print("| scenario | recall@10 | MRR@10 | top tens with an attack memory | first places | "
              "attack memories' places in the tens | each memory's top tens |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for name, r in results.items():
            each = sorted((v["top10"] for v in r["per_memory"].values()), reverse=True)
            shown = ", ".join(map(str, each[:10])) + (" ..." if len(each) > 10 else "")
            print(f"| {name} | {r['recall@10']:.3f} ({r['recall@10'] - clean['recall@10']:+.3f}) | "
                  f"{r['mrr@10']:.3f} ({r['mrr@10'] - clean['mrr@10']:+.3f}) | {r['top10_lists_with_attack']} | "
                  f"{r['first_places']} | {r['attack_slots']} | {shown or '-'} |")
        for name, r in results.items():
            if "near_copies" in r:
                n = r["near_copies"]
                print(f"\n{name}: of {n['questions_faked']} questions whose evidence turn was faked, the fake is in "
                      f"the ten for {n['fake_in_top10']}, above its real turn (or the real one out) for "
                      f"{n['fake_above_real']}, first for {n['fake_first']}; returned beside its real turn "
                      f"{n['fake_beside_real']} times, marked as its near copy {n['fake_beside_real_marked']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", type=Path, default=DATASET)
    parser.add_argument("--target", default="ann-05", help="the conversation attacked (default ann-05)")
    parser.add_argument("--attacks", default=",".join(ATTACKS), help=f"comma-separated, of: {', '.join(ATTACKS)}")
    parser.add_argument("--hubs", default="1,10", help="comma-separated numbers of hubs, one scenario each")
    parser.add_argument("--hub-words", type=int, default=180, help="a hub grows until it holds this many words")
    parser.add_argument("--hub-form", default="questions", metavar="FORM",
                        help="how a hub's questions are written: questions (default), flat, statements, grouped:K, single")
    parser.add_argument("--select-on", default=None, metavar="CONVERSATION_ID",
                        help="the conversation hubs are chosen on (default: the first tuning one not the target)")
    parser.add_argument("--pool-split", choices=("tuning", "test", "all"), default="tuning",
                        help="where hub questions come from (never the target or the selection conversation)")
    parser.add_argument("--near-copies", type=int, default=60, help="questions whose evidence turn is faked")
    parser.add_argument("--copies", type=int, default=29, help="memories holding the first hub's text")
    parser.add_argument("--confidence", type=float, default=1.0, help="every attack memory's confidence")
    parser.add_argument("--event-at", default=None, help="every attack memory's event time (ISO date)")
    parser.add_argument("--seed", type=int, default=5, help="picks the near-copies' questions")
    parser.add_argument("--stores", default="sqlite", help="comma-separated: sqlite, postgres")
    parser.add_argument("--json", type=Path, default=None, help="write the report here")
    parser.add_argument("--rows", action="store_true", help="keep every question's top ten in the JSON")
    args = parser.parse_args(argv)
    args.attacks = [a.strip() for a in args.attacks.split(",") if a.strip()]
    if unknown := [a for a in args.attacks if a not in ATTACKS]:
        parser.error(f"--attacks: unknown {unknown}; known: {list(ATTACKS)}")
    args.hubs = sorted({int(n) for n in args.hubs.split(",") if n.strip()})
    if ("hubs" in args.attacks or "copies" in args.attacks) and (not args.hubs or min(args.hubs) < 1):
        parser.error("--hubs needs at least one number of hubs, each 1 or more")
    if not re.fullmatch(r"questions|flat|statements|single|grouped:[1-9]\d*", args.hub_form):
        parser.error("--hub-form: questions, flat, statements, single or grouped:K")
    args.stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    if not args.stores or set(args.stores) - {"sqlite", "postgres"}:
        parser.error("--stores: sqlite and/or postgres")
    report = asyncio.run(run(args))
    print_table(report)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1))
        log(f"-> {args.json}")
    log(f"{report['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
