"""A public peer, mcp-memory-service 12.4.0 (all-MiniLM-L6-v2, sqlite-vec), on this project's conversation sets by the
held-out protocol, through its own MCP server over stdio: the retrieval issue quotes this peer's recall@10 on the
held-out real conversations (0.454), so its figure on our sets says how much harder the held-out set is than ours
for it (docs/retrieval-record.md, "0.7.23").

    sh scripts/peer_memory_service_setup.sh /tmp/peer       # once: the peer's venv and model cache (2-4 minutes)
    python scripts/peer_memory_service.py --peer /tmp/peer --dataset session_bench/data/conversations_annotated.json \
        --split test --json /tmp/peer-annotated.json

Per conversation: a fresh peer store, every turn stored in order as `memory_store {"content": "<speaker>: <text>"}`,
every question asked as `memory_search {"query": ..., "limit": 10}` (the tool's defaults otherwise: semantic mode,
no quality boost), each returned memory read back as the turn keys whose text it is. The peer runs as shipped but
for what this machine needs: its model from the local cache (sentence-transformers, not its default ONNX file,
which it downloads), offline. It refuses a turn nearly the same as one stored in the last day (cosine 0.85) or
exactly the same; such a turn is not in its store, which is the peer's behaviour, not the harness's. Scored by
this project's scorer next to plain BM25; `amfs-server bench retrieval intervals X.json --ranker "mcp-memory-service
12.4.0"` reads the JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

from amfs_server.session_bench.conversation_bench import (
    BM25_ROW, LIMIT, SPLITS, bm25_ranker, load_conversations, markdown, score_conversation, summarise, turn_value,
    turns_of,
)

PEER = "mcp-memory-service 12.4.0"
# One result of memory_search's text answer: "1. <content>\n   Hash: <hex>\n   Created: ..."
RESULT = re.compile(r"^\d+\. (.*?)\n   Hash: [0-9a-f]*\n", re.S | re.M)


def peer_env(peer: Path, store_dir: Path) -> dict[str, str]:
    return {
        "PATH": f"{peer / 'venv' / 'bin'}:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(store_dir),  # the peer keeps caches and backups under ~
        "MCP_MEMORY_STORAGE_BACKEND": "sqlite_vec",
        "MCP_MEMORY_BASE_DIR": str(store_dir),
        "MCP_MEMORY_SQLITE_PATH": str(store_dir / "sqlite_vec.db"),
        "MCP_EMBEDDING_MODEL": "all-MiniLM-L6-v2",  # its default
        "MCP_MEMORY_USE_ONNX": "0",  # its ONNX model is a download; the same weights through sentence-transformers
        "HF_HOME": str(peer / "hf_home"),
        "MCP_MEMORY_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
        "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1",
    }


def read_results(text: str, keys_of: dict[str, list[str]]) -> list[str]:
    """memory_search's answer as turn keys, best first (a text several turns share names each of them)."""
    ranked: list[str] = []
    for match in RESULT.finditer(text):
        ranked += [key for key in keys_of.get(match.group(1), []) if key not in ranked]
    return ranked


async def run_conversation(
    peer: Path, conversation: dict[str, Any], store_dir: Path
) -> tuple[list[list[str]], list[str]]:
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    params = StdioServerParameters(command=str(peer / "venv" / "bin" / "memory"), args=["server"],
                                   env=peer_env(peer, store_dir))
    with open(store_dir / "server.log", "w") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            return await store_and_ask(session, conversation)


async def store_and_ask(session: Any, conversation: dict[str, Any]) -> tuple[list[list[str]], list[str]]:
    """Every turn stored, every question asked, on the peer's MCP `session`: the turn keys it answers each question
    with, and the keys of the turns it refused as duplicates."""
    turns = turns_of(conversation)
    keys_of: dict[str, list[str]] = {}
    for turn in turns:
        keys_of.setdefault(turn_value(turn), []).append(turn["key"])
    refused: list[str] = []
    for turn in turns:
        text = answer_text(await session.call_tool("memory_store", {"content": turn_value(turn)}))
        if not text.lower().startswith("memory stored"):
            if "duplicate content" not in text.lower():
                raise RuntimeError(f"memory_store failed on {turn['key']}: {text[:300]}")
            refused.append(turn["key"])
    ranked = []
    for question in conversation["questions"]:
        result = await session.call_tool("memory_search", {"query": question["question"], "limit": LIMIT})
        if result.is_error:
            raise RuntimeError(f"memory_search failed: {answer_text(result)[:300]}")
        ranked.append(read_results(answer_text(result), keys_of))
    return ranked, refused


def answer_text(result: Any) -> str:
    return "\n".join(getattr(part, "text", "") for part in result.content)


async def run(peer: Path, conversations: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    rows: dict[str, list[dict[str, Any]]] = {PEER: [], BM25_ROW: []}
    with tempfile.TemporaryDirectory(prefix="amfs-peer-") as tmp:
        for conversation in conversations:
            store_dir = Path(tmp) / conversation["conversation_id"]
            store_dir.mkdir()
            ranked, refused = await run_conversation(peer, conversation, store_dir)
            rows[PEER] += score_conversation(conversation, ranked)
            rows[BM25_ROW] += score_conversation(
                conversation, await bm25_ranker(None, conversation, conversation["questions"]))
            lost = sum(bool(set(q["evidence"]) & set(refused)) for q in conversation["questions"])
            print(f"[peer] {conversation['conversation_id']}: {len(ranked)} questions; the peer refused {len(refused)} "
                  f"turns as duplicates, evidence of {lost} questions", file=sys.stderr, flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peer", type=Path, required=True, help="the folder peer_memory_service_setup.sh filled")
    parser.add_argument("--dataset", type=Path, required=True)
    parser.add_argument("--split", choices=SPLITS, default="test")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    args.peer = args.peer.resolve()  # the peer's server runs with its own HOME; its paths must not depend on ours
    if not os.access(args.peer / "venv" / "bin" / "memory", os.X_OK):
        parser.error(f"--peer {args.peer}: no peer installed there; run sh scripts/peer_memory_service_setup.sh "
                     f"{args.peer} first")
    conversations = load_conversations(args.dataset, args.split)
    rows = asyncio.run(run(args.peer, conversations))
    summary = summarise(rows)
    print(markdown(summary, f"{PEER} over MCP stdio, {args.dataset.name}"))
    if args.json is not None:
        report = {"split": args.split, "dataset": str(args.dataset), "conversations": [c["conversation_id"] for c in
                  conversations], "runs": {"peer": {"summary": summary, "questions": rows}}}
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
