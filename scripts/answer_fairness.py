"""How long one caller's short question waits for the answer worker while another caller has several long ones.

The answer worker runs one generation at a time. This starts `--greedy-calls` long answers (text mode, the
top `--memories` memories in the prompt, `--greedy-tokens` new tokens each) for one caller, then, once they are all
waiting or running, one short question for a second caller, and prints how long each call waited for the worker
(`queue_ms`) and took in all. In process, on the embedded store, with the backbone `amfs_answer` uses:

    python scripts/answer_fairness.py --backbone smollm2
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from amfs_server.core.models import Actor
from amfs_server.core.service import WriteRequest
from amfs_server.ml.answer.worker import LMWorker
from amfs_server.server.composition import build_service
from amfs_server.server.settings import load_settings


async def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as data_dir:
        service = build_service(load_settings({}, data_dir=Path(data_dir), embedder="none"))
        await service.open()
        writer = Actor("writer", "s0")
        notes = [WriteRequest("notes/ops", f"note-{i:03d}",
                              f"Runbook note {i}: the deploy of service {i} waits for the canary, checks error rates "
                              f"and latency for ten minutes, and rolls back on any alert from the on-call rota.")
                 for i in range(args.memories)]
        await service.write_many(writer, notes)
        worker = LMWorker(args.backbone, device="cpu")
        await worker.load()
        greedy, other = Actor("greedy-key", "s1"), Actor("other-key", "s2")

        async def ask(actor: Actor, question: str, tokens: int) -> tuple[str, float, float]:
            started = time.perf_counter()
            result = await worker.answer(service, actor, question, "text", "notes/ops", tokens, memories=args.memories)
            return actor.agent_id, result.queue_ms, (time.perf_counter() - started) * 1000

        long_question = "Summarise every runbook note about deploys, canaries, error rates and rollbacks."
        tasks = [asyncio.ensure_future(ask(greedy, long_question, args.greedy_tokens))
                 for _ in range(args.greedy_calls)]
        await asyncio.sleep(0.5)  # the greedy caller's calls are running or waiting
        tasks.append(asyncio.ensure_future(ask(other, "What does a deploy wait for?", 4)))
        for caller, queue_ms, total_ms in await asyncio.gather(*tasks):
            print(f"{caller:10s} waited {queue_ms / 1000:6.1f} s, took {total_ms / 1000:6.1f} s in all")
        worker.close()
        await service.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backbone", default="smollm2")
    parser.add_argument("--greedy-calls", type=int, default=4, help="the greedy caller's calls (a key's 4 in progress)")
    parser.add_argument("--greedy-tokens", type=int, default=100)
    parser.add_argument("--memories", type=int, default=20)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
