"""Make chat-mpnet's fast question side: seven of its twelve layers, the top few retrained so that a question lands
where the full model puts it, while every stored memory keeps its chat-mpnet vectors. A store does not change;
only the question's side gets cheaper (7/12 of the compute).

Why: on a 2-core CPU without AVX-512 VNNI chat-mpnet embeds a question in 34-59 ms, which alone misses the
50 ms retrieve target (README, "Latency at scale").

Recipe (its constants fixed before any ranking result was seen; README "A fast question side" has what was chosen
on which split):
- texts: the questions and turns (`Speaker: text`) of the tuning and training conversations (never a test split,
  never the agent-memory set), at most MAX_PER_KIND of each (seed 0), and DOCSTRINGS first paragraphs of docstrings
  of the installed Python packages (technical prose, so that agents' questions are not a kind it never saw; which
  ones depends on the environment: the README's full install plus `onnx`). No evidence labels.
- teacher: the bundled chat-mpnet ONNX model, one text at a time as a retrieve embeds it: its query vector (the
  target) and its token states after its third layer (the student's frozen input), in one run.
- student: chat-mpnet's layers 1-3 as they are, then its layers 9-12 (4-8 skipped), started from their weights;
  only those four trained (AdamW, lr 5e-5, one-cycle, batch 32, EPOCHS) on 1 - cos(student, teacher). The
  relative position bias is shared with the frozen layers and stays frozen. (Earlier candidates: `--trained-layers
  2` and `3 --docstrings 4000`, the 0.7.5 side; docs/retrieval-record.md.)
- export: the teacher's graph rewired to skip layers 4-8, the four trained layers quantised to 8-bit blocks of 128
  by onnxruntime's own scheme (`quantize_blocks` gives the teacher's own bytes back from its dequantised weights),
  every unchanged weight left where it is: those initializers point into chat-mpnet's file (ONNX external data,
  `SHARED_WEIGHTS`), which the embedder inflates beside this graph, so the file holds four layers, not seven.

    python scripts/distill_query_encoder.py --out /tmp/mpnet-query          # teacher pass, training, export
    cp /tmp/mpnet-query/model_int8.onnx.gz adapters/models/chat-mpnet-query/
    amfs-server bench retrieval conversations --dataset ... --split tuning --query-encoder fast

Needs torch and transformers (the `[lm]` extra) and onnx (the `[gemma]` extra, or `pip install onnx`).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import gzip
import hashlib
import json
import random
import shutil
import sys
import sysconfig
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "session_bench" / "data"
# (file, splits): the conversations whose questions and turns are training text (None: every conversation of a
# training-only file). The annotated and generated tuning halves lend texts only, never their answers.
SOURCES = [
    ("conversations_annotated.json", {"tuning"}),
    ("conversations_annotated_train.json", None),
    ("conversations_authored.json", {"tuning"}),
    ("conversations_authored_train.json", None),
    ("conversations_eval.json", {"tuning"}),
]
MAX_PER_KIND = 5000
DOCSTRINGS = 8000
LAYERS = 7  # of chat-mpnet's 12: the question side's share of the compute
TRAINED = 4  # the top ones, retrained; the first LAYERS - TRAINED run as they are (--trained-layers)
KEPT = [*range(LAYERS - TRAINED), *range(12 - TRAINED, 12)]  # chat-mpnet's layers the question side runs (0-based)
EPOCHS = 4
BATCH = 32
LEARNING_RATE = 5e-5
MAX_TOKENS = 256  # as the embedder cuts a question
LAYER_OUT = "/inner/encoder/layer.{}/output/LayerNorm/LayerNormalization_output_0"
EMBEDDINGS_OUT = "/inner/embeddings/LayerNorm/LayerNormalization_output_0"


def training_conversations() -> list[dict]:
    """The tuning and training conversations (never a test split)."""
    chosen = []
    for name, splits in SOURCES:
        for conversation in json.loads((DATA / name).read_text())["conversations"]:
            split = conversation.get("split")
            if split != "test" and (splits is None or split in splits):
                chosen.append(conversation)
    return chosen


def training_texts(conversations: list[dict]) -> tuple[list[str], list[str]]:
    """(questions, turns as `Speaker: text`) of the conversations, deduplicated, in order."""
    questions: dict[str, None] = {}
    turns: dict[str, None] = {}
    for conversation in conversations:
        for session in conversation["sessions"]:
            for turn in session["turns"]:
                turns.setdefault(f"{turn['speaker']}: {turn['text']}")
        for question in conversation["questions"]:
            questions.setdefault(question["question"])
    return list(questions), list(turns)


def docstrings(limit: int, seed: int) -> list[str]:
    """First paragraphs (30-400 characters) of the docstrings of the installed packages' modules, files in a seeded
    order, deduplicated."""
    files = sorted(Path(sysconfig.get_paths()["purelib"]).rglob("*.py"))
    random.Random(seed).shuffle(files)
    found: dict[str, None] = {}
    for path in files:
        if len(found) >= limit:
            break
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                text = ast.get_docstring(node)
                if text:
                    paragraph = " ".join(text.split("\n\n")[0].split())
                    if 30 <= len(paragraph) <= 400:
                        found.setdefault(paragraph)
    return list(found)[:limit]


def corpus(seed: int, docstring_count: int = DOCSTRINGS) -> list[str]:
    rng = random.Random(seed)
    questions, turns = training_texts(training_conversations())
    rng.shuffle(questions)
    rng.shuffle(turns)
    return list(dict.fromkeys(questions[:MAX_PER_KIND] + turns[:MAX_PER_KIND] + docstrings(docstring_count, seed)))


def read_teacher() -> bytes:
    """chat-mpnet's bundled ONNX file, inflated in memory."""
    with gzip.open(ROOT / "adapters" / "models" / "chat-mpnet" / "model_int8.onnx.gz", "rb") as packed:
        return packed.read()


def teacher_pass(teacher_bytes: bytes, texts: list[str], cache: Path):
    """Per text, chat-mpnet's query vector and its token states after the last frozen layer (float16), in one
    run of a copy of the graph with that extra output; cached in `cache`."""
    import numpy as np
    import onnx
    import onnxruntime as ort

    from amfs_server.adapters.onnx_embedder import cpu_session_options
    from amfs_server.adapters.wordpiece import WordPieceTokenizer

    if cache.exists():
        with np.load(cache, allow_pickle=False) as saved:
            if list(saved["texts"]) == texts:
                return saved["vectors"], saved["states"], saved["lengths"]
    frozen_top = KEPT[len(KEPT) - TRAINED - 1]
    model = onnx.load_from_string(teacher_bytes)
    model.graph.output.append(onnx.helper.make_tensor_value_info(LAYER_OUT.format(frozen_top), onnx.TensorProto.FLOAT, None))
    session = ort.InferenceSession(model.SerializeToString(), cpu_session_options(2), providers=["CPUExecutionProvider"])
    tokenizer = WordPieceTokenizer.from_file(ROOT / "adapters" / "models" / "chat-mpnet" / "tokenizer.json")
    vectors, states, lengths, started = [], [], [], time.time()
    for i, text in enumerate(texts):
        ids = np.array([tokenizer.encode(text, MAX_TOKENS)], dtype=np.int64)
        final, frozen = session.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids)})
        pooled = final[0].mean(axis=0)
        vectors.append(pooled / np.linalg.norm(pooled))
        states.append(frozen[0].astype(np.float16))
        lengths.append(len(ids[0]))
        if (i + 1) % 1000 == 0:
            print(f"teacher {i + 1}/{len(texts)} ({time.time() - started:.0f} s)", file=sys.stderr, flush=True)
    result = np.stack(vectors).astype(np.float32), np.concatenate(states), np.array(lengths)
    np.savez(cache, texts=np.array(texts), vectors=result[0], states=result[1], lengths=result[2])
    return result


def teacher_weights(model) -> dict:
    """chat-mpnet's weights as a transformers MPNetModel state dict, dequantised from the 8-bit ONNX graph."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    init = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    state = {}
    for name, array in init.items():
        if not name.startswith("inner."):
            continue
        key = name[len("inner."):]
        if name.endswith("_quantized"):
            base = name[: -len("_quantized")]
            zero, scale = init[base + "_zero_point"].astype(np.float32), init[base + "_scale"]
            state[key[: -len("_quantized")]] = (array.astype(np.float32) - zero) * scale
        elif not name.endswith(("_scale", "_zero_point")):
            state[key] = array.astype(np.float32)
    for node in model.graph.node:
        if node.op_type == "MatMulNBits":
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            assert attrs["bits"] == 8 and len(node.input) == 3, node.name  # symmetric: zero point 128
            q, scales = init[node.input[1]].astype(np.float32), init[node.input[2]]
            weight = ((q - 128.0) * scales[:, :, None]).reshape(attrs["N"], -1)[:, : attrs["K"]]
            state[_node_weight(node.name)] = weight.astype(np.float32)
    return state


def _node_weight(node_name: str) -> str:
    """`/inner/encoder/layer.10/attention/attn/q/MatMul_Q8` -> `encoder.layer.10.attention.attn.q.weight`."""
    return node_name[len("/inner/"):].replace("/MatMul_Q8", "").replace("/", ".") + ".weight"


def quantize_blocks(weight):
    """[N, K] float -> MatMulNBits 8-bit symmetric blocks of 128 by onnxruntime's scheme (a block's value of largest
    magnitude maps to -128, so a scale may be negative): uint8 [N, K/128, 128] and scales [N, K/128]."""
    import numpy as np

    n, k = weight.shape
    blocks = weight.reshape(n, k // 128, 128).astype(np.float32)
    extreme = np.take_along_axis(blocks, np.abs(blocks).argmax(axis=2)[:, :, None], axis=2)[:, :, 0]
    scale = (extreme / -128.0).astype(np.float32)
    safe = np.where(scale == 0, 1.0, scale).astype(np.float32)
    q = np.clip(np.rint(blocks / safe[:, :, None]), -128, 127) + 128
    return q.astype(np.uint8), scale


def top_layers(teacher: dict):
    """The trained layers as a torch module (transformers' MPNetEncoder, all-mpnet-base-v2's shape) started from
    the teacher's weights, and `forward(states, mask)`: their mean-pooled output over the frozen layers' token
    states, the function the exported graph computes."""
    import torch
    from transformers import MPNetConfig
    from transformers.masking_utils import create_bidirectional_mask
    from transformers.models.mpnet.modeling_mpnet import MPNetEncoder

    config = MPNetConfig(num_hidden_layers=TRAINED, layer_norm_eps=1e-5)  # all-mpnet-base-v2's, but only the trained layers
    config._attn_implementation = "eager"
    top = MPNetEncoder(config)
    state = {"relative_attention_bias.weight": torch.from_numpy(teacher["encoder.relative_attention_bias.weight"])}
    for i, j in enumerate(KEPT[-TRAINED:]):
        prefix = f"encoder.layer.{j}."
        state.update({f"layer.{i}.{k[len(prefix):]}": torch.from_numpy(v) for k, v in teacher.items() if k.startswith(prefix)})
    top.load_state_dict(state, strict=True)
    top.relative_attention_bias.weight.requires_grad_(False)  # the frozen layers below use it too

    def forward(states, mask):
        hidden = top(states, attention_mask=create_bidirectional_mask(config=config, inputs_embeds=states,
                                                                      attention_mask=mask))[0]
        weights = mask.unsqueeze(-1).float()
        return (hidden * weights).sum(1) / weights.sum(1)

    return top, forward


def padded(items):
    """(states [batch, tokens, 768], mask) of a list of token-state arrays."""
    import numpy as np
    import torch

    width = max(len(s) for s in items)
    states = torch.zeros(len(items), width, items[0].shape[1])
    mask = torch.zeros(len(items), width, dtype=torch.long)
    for row, s in enumerate(items):
        states[row, : len(s)] = torch.from_numpy(s.astype(np.float32))
        mask[row, : len(s)] = 1
    return states, mask


def train(teacher: dict, vectors, states, lengths, epochs: int, seed: int) -> dict:
    """The top TRAINED layers of KEPT, started from chat-mpnet's, trained on the frozen layers' token states;
    returns their weights under the teacher's names (`encoder.layer.{j}.*`)."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    torch.manual_seed(seed)
    torch.set_num_threads(2)
    top, forward = top_layers(teacher)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    examples = [(states[a:a + n], vectors[i]) for i, (a, n) in enumerate(zip(starts, lengths))]
    optimiser = torch.optim.AdamW([p for p in top.parameters() if p.requires_grad], lr=LEARNING_RATE, weight_decay=0.01)
    per_epoch = (len(examples) + BATCH - 1) // BATCH
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimiser, LEARNING_RATE, total_steps=max(1, epochs * per_epoch),
                                                   pct_start=0.05)
    rng = np.random.default_rng(seed)
    started = time.time()
    for epoch in range(epochs):
        # batches of similar lengths (less padding), in a random order
        order = rng.permutation(len(examples))
        batches = []
        for chunk in range(0, len(order), BATCH * 20):
            ranked = sorted(order[chunk:chunk + BATCH * 20], key=lambda k: len(examples[k][0]))
            batches += [ranked[i:i + BATCH] for i in range(0, len(ranked), BATCH)]
        rng.shuffle(batches)
        for step, batch in enumerate(batches, 1):
            target = torch.from_numpy(np.stack([examples[k][1] for k in batch]))
            loss = (1 - F.cosine_similarity(forward(*padded([examples[k][0] for k in batch])), target)).mean()
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            schedule.step()
            if step % 100 == 0 or step == len(batches):
                print(f"epoch {epoch + 1}/{epochs} step {step}/{len(batches)} 1-cos {loss.item():.4f} "
                      f"({time.time() - started:.0f} s)", file=sys.stderr, flush=True)
    out = {}
    for i, j in enumerate(KEPT[-TRAINED:]):
        prefix = f"layer.{i}."
        out.update({f"encoder.layer.{j}.{k[len(prefix):]}": v.detach().numpy()
                    for k, v in top.state_dict().items() if k.startswith(prefix)})
    return out


def build(teacher_bytes: bytes, trained: dict, out: Path) -> Path:
    """The question side's graph: the teacher's, rewired to run KEPT only, the trained layers' initializers
    replaced (8-bit blocks), the rest pointing into the teacher's file; returns the gzip-compressed file."""
    import onnx
    from onnx import numpy_helper

    from amfs_server.adapters.onnx_embedder import point_into_shared_weights

    model = onnx.load_from_string(teacher_bytes)
    graph = model.graph
    previous = EMBEDDINGS_OUT
    for layer in KEPT:
        own_input = LAYER_OUT.format(layer - 1) if layer > 0 else EMBEDDINGS_OUT
        for node in graph.node:
            if node.name.startswith(f"/inner/encoder/layer.{layer}/"):
                for i, name in enumerate(node.input):
                    if name == own_input:
                        node.input[i] = previous
        previous = LAYER_OUT.format(layer) if layer < 11 else "last_hidden_state"
    initializers = {t.name: t for t in graph.initializer}
    replaced, pending = set(), dict(trained)
    for node in graph.node:
        key = _node_weight(node.name) if node.op_type == "MatMulNBits" else None
        if key in pending:
            for name, array in zip(node.input[1:3], quantize_blocks(pending.pop(key))):
                assert list(initializers[name].dims) == list(array.shape), name
                initializers[name].CopyFrom(numpy_helper.from_array(array, name))
                replaced.add(name)
    for key, array in pending.items():  # biases and layer norms keep their float32 names
        name = "inner." + key
        assert list(initializers[name].dims) == list(array.shape), name
        initializers[name].CopyFrom(numpy_helper.from_array(array.astype("float32"), name))
        replaced.add(name)
    if previous != "last_hidden_state":
        raise ValueError("the kept layers must end with the teacher's last")
    # drop what the output no longer needs (the skipped layers)
    producers = {output: node for node in graph.node for output in node.output}
    needed, stack = set(), ["last_hidden_state"]
    while stack:
        node = producers.get(stack.pop())
        if node is not None and id(node) not in needed:
            needed.add(id(node))
            stack.extend(name for name in node.input if name)
    nodes = [node for node in graph.node if id(node) in needed]
    used = {name for node in nodes for name in node.input}
    kept_initializers = [t for t in graph.initializer if t.name in used]
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.initializer[:]
    graph.initializer.extend(kept_initializers)
    del graph.value_info[:]
    point_into_shared_weights(model, teacher_bytes, replaced)  # the unchanged ones: the teacher's file
    plain = out / "model_int8.onnx"
    plain.write_bytes(model.SerializeToString())
    packed = out / "model_int8.onnx.gz"
    with plain.open("rb") as source, gzip.GzipFile(packed, "wb", compresslevel=9, mtime=0) as target:
        shutil.copyfileobj(source, target)
    return packed


def fit_report(model: Path | None = None) -> dict[str, float]:
    """Median cosine of a fast question side (None: the bundled one; else a built `model_int8.onnx[.gz]`) to
    chat-mpnet's own question vector, on the annotated tuning chats' questions (texts the recipe trains on) and on
    the agent-memory set's even questions (never trained on; the tuning half of that set)."""
    import numpy as np

    from amfs_server.adapters.embedders import load_embedder
    from amfs_server.adapters.onnx_embedder import VARIANTS, OnnxEmbedder
    from amfs_server.core.embedding import embed_queries

    variant = "chat-mpnet-query-int8"
    if model is not None:  # loaded as the bundled one is, with the same check of chat-mpnet's file
        VARIANTS[variant] = dataclasses.replace(VARIANTS[variant], bundled=model)
    fast, full = OnnxEmbedder(variant=variant).load(), load_embedder("chat-mpnet", query_encoder="full")
    chats = json.loads((DATA / "conversations_annotated.json").read_text())["conversations"]
    annotated = [question["question"] for chat in chats if chat["split"] == "tuning" for question in chat["questions"]]
    agent = [question["question"] for question in json.loads((DATA / "retrieval_eval.json").read_text())["questions"]][0::2]
    report = {}
    for name, texts in (("annotated tuning questions", annotated), ("agent memories, even questions", agent)):
        cosines = [float(np.dot(fast.embed([text])[0], embed_queries(full, [text])[0])) for text in texts]
        report[name] = round(float(np.median(cosines)), 3)
        print(f"{name} ({len(texts)}): median cosine {report[name]}", file=sys.stderr)
    return report


def main(argv: list[str] | None = None) -> int:
    global TRAINED, KEPT
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="folder for the teacher cache and the model")
    parser.add_argument("--fit", nargs="?", type=Path, const=True, default=None, metavar="MODEL",
                        help="only report how closely a fast side (the bundled one, or MODEL) fits chat-mpnet")
    parser.add_argument("--epochs", type=int, default=EPOCHS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trained-layers", type=int, default=TRAINED,
                        help=f"how many of the {LAYERS} layers are chat-mpnet's top ones, retrained (default {TRAINED})")
    parser.add_argument("--docstrings", type=int, default=DOCSTRINGS,
                        help=f"how many docstring paragraphs join the training texts (default {DOCSTRINGS})")
    args = parser.parse_args(argv)
    if args.fit is not None:
        fit_report(None if args.fit is True else args.fit)
        return 0
    if args.out is None:
        parser.error("--out is required (or --fit)")
    TRAINED = args.trained_layers
    KEPT = [*range(LAYERS - TRAINED), *range(12 - TRAINED, 12)]

    import onnx

    args.out.mkdir(parents=True, exist_ok=True)
    teacher_bytes = read_teacher()
    texts = corpus(args.seed, args.docstrings)
    print(f"{len(texts)} texts; teacher sha256 {hashlib.sha256(teacher_bytes).hexdigest()}", file=sys.stderr)
    vectors, states, lengths = teacher_pass(teacher_bytes, texts, args.out / f"teacher-{LAYERS - TRAINED}.npz")
    trained = train(teacher_weights(onnx.load_from_string(teacher_bytes)), vectors, states, lengths, args.epochs,
                    args.seed)
    packed = build(teacher_bytes, trained, args.out)
    print(f"wrote {packed} (sha256 {hashlib.sha256(packed.read_bytes()).hexdigest()})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
