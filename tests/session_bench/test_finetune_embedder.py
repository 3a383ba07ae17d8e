"""scripts/finetune_embedder.py: what it trains on, its pairs, and that a training step moves the model toward them.

Uses the real base MiniLM (the [lm] extra) on one authored tuning conversation."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from .scripts_dir import ROOT, script as load_script

AUTHORED = ROOT / "session_bench" / "data" / "conversations_authored.json"


def script(name: str = "finetune_embedder"):
    return load_script(name)


def stand_in_teacher(texts, seed: int) -> dict:
    """Random unit vectors for `texts`: a teacher whose scores the student does not share, and known here."""
    import numpy as np

    rng = np.random.default_rng(seed)
    teacher = {}
    for text in texts:
        row = rng.normal(size=16).astype(np.float32)
        teacher[text] = row / np.linalg.norm(row)
    return teacher


def one_conversation(tmp_path: Path) -> Path:
    data = json.loads(AUTHORED.read_text())
    data["conversations"] = data["conversations"][:1]  # auth-01, tuning split
    path = tmp_path / "one.json"
    path.write_text(json.dumps(data))
    return path


def test_it_refuses_a_test_split_and_an_empty_selection(tmp_path: Path) -> None:
    finetune = script()
    with pytest.raises(SystemExit, match="refusing to train on a test split"):
        finetune.load_pairs([f"{AUTHORED}:test"])
    with pytest.raises(SystemExit, match="no conversations selected"):
        finetune.load_pairs([f"{AUTHORED}:train"])  # the benchmark file has no train split


def test_pairs_are_turns_as_the_server_embeds_them_with_a_hard_negative_that_is_not_evidence(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="fine-tuning needs the [lm] extra")
    from transformers import AutoModel, AutoTokenizer

    from amfs_server.adapters.torch_embedder import MiniLMEmbedder

    finetune = script()
    conversations = finetune.load_pairs([f"{one_conversation(tmp_path)}:tuning"])
    assert [c["id"] for c in conversations] == ["auth-01"]
    turns = conversations[0]["turns"]
    assert all(text.startswith("chat message: Maya: ") or text.startswith("chat message: Theo: ") for text in turns.values())
    base = MiniLMEmbedder().model_dir()
    tokenizer = AutoTokenizer.from_pretrained(str(base), local_files_only=True)
    model = AutoModel.from_pretrained(str(base), local_files_only=True)
    examples = finetune.triplets(model, tokenizer, conversations, "cpu", random.Random(0))
    questions = conversations[0]["questions"]
    assert len(examples) == sum(len(q["evidence"]) for q in questions)
    by_question = {q["q"]: {turns[key] for key in q["evidence"]} for q in questions}
    for question, positive, negative, evidence in examples:
        assert positive in by_question[question] and evidence == frozenset(by_question[question])
        assert negative not in evidence

    # One training step on the first batch lowers that batch's loss (the loss is the one the recipe optimises).
    import torch

    torch.manual_seed(0)
    batch = examples[: finetune.BATCH]

    def loss() -> float:
        with torch.no_grad():
            docs = [b[1] for b in batch] + [b[2] for b in batch]
            enc = tokenizer([b[0] for b in batch] + docs, padding=True, truncation=True,
                            max_length=finetune.MAX_TOKENS, return_tensors="pt")
            vectors = finetune.pool(model(**enc).last_hidden_state, enc["attention_mask"])
            logits = vectors[: len(batch)] @ vectors[len(batch):].T * finetune.SCALE
            return float(torch.nn.functional.cross_entropy(logits, torch.arange(len(batch))))

    before = loss()
    finetune.train(model, tokenizer, list(batch), "cpu", 1, random.Random(0))
    assert loss() < before


def test_the_blend_is_each_weight_between_the_base_and_the_fine_tuned_model(tmp_path: Path) -> None:
    """scripts/interpolate_embedder.py: share 0 is the base model, 1 the fine-tuned one, 0.25 a quarter of the way;
    a share outside 0-1 is refused before anything is written."""
    pytest.importorskip("torch", reason="the blend needs the [lm] extra")
    import torch
    from transformers import AutoModel, AutoTokenizer

    from amfs_server.adapters.torch_embedder import MiniLMEmbedder

    blend = script("interpolate_embedder")
    base_dir = MiniLMEmbedder().model_dir()
    tuned = AutoModel.from_pretrained(str(base_dir), local_files_only=True)
    with torch.no_grad():
        for parameter in tuned.parameters():
            parameter.add_(1.0)  # a stand-in "fine-tuned" model: every weight moved by exactly 1
    tuned.save_pretrained(str(tmp_path / "tuned"))
    AutoTokenizer.from_pretrained(str(base_dir), local_files_only=True).save_pretrained(str(tmp_path / "tuned"))

    with pytest.raises(SystemExit):
        blend.main(["--fine-tuned", str(tmp_path / "tuned"), "--share", "1.5", "--out", str(tmp_path / "bad")])
    with pytest.raises(SystemExit):
        blend.main(["--fine-tuned", str(tmp_path / "missing"), "--share", "0.5", "--out", str(tmp_path / "bad")])
    assert not (tmp_path / "bad").exists()

    base = AutoModel.from_pretrained(str(base_dir), local_files_only=True).state_dict()
    for share in (0.0, 0.25, 1.0):
        out = tmp_path / f"blend-{share}"
        assert blend.main(["--fine-tuned", str(tmp_path / "tuned"), "--share", str(share), "--out", str(out)]) == 0
        blended = AutoModel.from_pretrained(str(out), local_files_only=True).state_dict()
        for name, weights in blended.items():
            if weights.is_floating_point():
                assert torch.allclose(weights, base[name] + share, atol=1e-5), (name, share)
        assert (out / "tokenizer.json").is_file()


def test_a_negatives_model_that_is_not_there_is_refused_before_training(tmp_path: Path) -> None:
    finetune = script()
    with pytest.raises(SystemExit):
        finetune.main(["--out", str(tmp_path / "out"), "--data", f"{AUTHORED}:tuning",
                       "--negatives-from", str(tmp_path / "missing")])
    assert not (tmp_path / "out").exists()


def test_the_served_score_it_can_train_on_is_the_score_the_server_computes(tmp_path: Path) -> None:
    """`--served-score` trains on `served_scores`; with the same model it must equal what the server scores a turn
    by (`embed_entries` then `entry_similarity`), for turns of one, several sentences, with and without context."""
    pytest.importorskip("torch", reason="fine-tuning needs the [lm] extra")
    import numpy as np
    import torch
    from transformers import AutoModel, AutoTokenizer

    from amfs_server.adapters.torch_embedder import MiniLMEmbedder
    from amfs_server.core.embedding import EntryTexts, embed_entries, entry_similarity

    finetune = script()
    conversation = finetune.load_pairs([f"{one_conversation(tmp_path)}:tuning"])[0]
    served = conversation["served"]
    assert all(served[key][0] == whole for key, whole in conversation["turns"].items())
    keys = list(served)
    first = keys[0]
    several = next(key for key in keys[1:] if len(served[key]) > 3)  # whole, 2+ sentences, context
    single = next(key for key in keys[1:] if len(served[key]) == 2)  # whole and context only
    assert served[first][-1] == ""  # the first turn has no turn before it
    chosen = [first, several, single]

    base = MiniLMEmbedder().model_dir()
    tokenizer = AutoTokenizer.from_pretrained(str(base), local_files_only=True)
    model = AutoModel.from_pretrained(str(base), local_files_only=True).eval()

    def encode_rows(texts: list[str]):
        enc = tokenizer(texts, padding=True, truncation=True, max_length=finetune.MAX_TOKENS, return_tensors="pt")
        return finetune.pool(model(**enc).last_hidden_state, enc["attention_mask"])

    questions = [q["q"] for q in conversation["questions"][:3]]
    with torch.no_grad():
        # Encoding in chunks sorted by length (how training calls it) gives the same rows in the same order.
        texts = [text for key in chosen for text in served[key] if text]
        assert torch.allclose(finetune.by_length(texts, encode_rows, chunk=2), encode_rows(texts), atol=1e-5)
        query_rows = encode_rows(questions)
        trained_on = finetune.served_scores(query_rows, [served[key] for key in chosen], encode_rows).numpy()
        made = embed_entries(lambda texts: encode_rows(texts).numpy(),
                             [EntryTexts(served[key][0], list(served[key][1:-1])) for key in chosen],
                             [served[key][-1] or None for key in chosen])
    for qi, query in enumerate(query_rows.numpy()):
        for di in range(len(chosen)):
            server = entry_similarity(float(made.vectors[di] @ query), made.passages[di], query)
            assert np.isclose(trained_on[qi, di], server, atol=1e-4), (questions[qi], chosen[di])


def test_a_teacher_that_is_not_there_is_refused_before_training(tmp_path: Path) -> None:
    finetune = script()
    with pytest.raises(SystemExit):
        finetune.main(["--out", str(tmp_path / "out"), "--data", f"{AUTHORED}:tuning",
                       "--teacher", str(tmp_path / "missing")])
    assert not (tmp_path / "out").exists()


def test_teacher_vectors_embed_only_what_the_cache_lacks(tmp_path: Path) -> None:
    """Texts the cache holds are taken from it; the rest are embedded by the teacher (here all-MiniLM-L6-v2, which
    names no prompts: a turn is its raw `Speaker: text`, without the student's header) and added to the cache."""
    pytest.importorskip("sentence_transformers", reason="the teacher runs on the [lm] extra")
    import numpy as np
    from sentence_transformers import SentenceTransformer

    from amfs_server.adapters.torch_embedder import MiniLMEmbedder

    finetune = script()
    conversations = finetune.load_pairs([f"{one_conversation(tmp_path)}:tuning"])
    conversation = conversations[0]
    turn_keys = list(conversation["turns"])
    keys = [conversation["turns"][key] for key in turn_keys] + [q["q"] for q in conversation["questions"]]
    cached = keys[1:-1]  # the first turn and the last question are left to the teacher
    vectors = np.random.default_rng(0).normal(size=(len(cached), 384)).astype(np.float32)
    cache = tmp_path / "teacher.npz"
    np.savez(cache, keys=np.array(cached), vectors=vectors)

    got = finetune.teacher_vectors(MiniLMEmbedder().model_dir(), conversations, cache)
    assert set(got) == set(keys)
    assert np.array_equal(got[cached[5]], vectors[5])
    teacher = SentenceTransformer(str(MiniLMEmbedder().model_dir()), device="cpu")
    first_turn = conversation["raw"][turn_keys[0]]
    assert first_turn == keys[0].removeprefix("chat message: ")
    expected = teacher.encode([first_turn, keys[-1]], normalize_embeddings=True)
    assert np.allclose(got[keys[0]], expected[0], atol=1e-5) and np.allclose(got[keys[-1]], expected[1], atol=1e-5)
    held = np.load(cache)
    assert len(held["keys"]) == len(keys)  # the two new texts were added to the cache


@pytest.mark.parametrize("distill", ["kl", "margin"])
def test_the_teacher_term_pulls_the_students_scores_toward_the_teachers(tmp_path: Path, distill: str) -> None:
    """With a stand-in teacher (random vectors, so scores the student does not share), one training step with a
    large distillation weight brings the student closer to it: the KL divergence of its in-batch softmax from the
    teacher's (`kl`), or the squared gap between the two margins of evidence turn over hard negative (`margin`)."""
    pytest.importorskip("torch", reason="fine-tuning needs the [lm] extra")
    import numpy as np
    import torch
    from transformers import AutoModel, AutoTokenizer

    from amfs_server.adapters.torch_embedder import MiniLMEmbedder

    finetune = script()
    conversations = finetune.load_pairs([f"{one_conversation(tmp_path)}:tuning"])
    base = MiniLMEmbedder().model_dir()
    tokenizer = AutoTokenizer.from_pretrained(str(base), local_files_only=True)
    model = AutoModel.from_pretrained(str(base), local_files_only=True)
    examples = finetune.triplets(model, tokenizer, conversations, "cpu", random.Random(0))
    batch = examples[: finetune.BATCH]
    teacher = stand_in_teacher(sorted({text for b in batch for text in (b[0], b[1], b[2])}), seed=0)
    questions = [b[0] for b in batch]
    documents = [b[1] for b in batch] + [b[2] for b in batch]
    mask = torch.tensor([[c != r and documents[c] in batch[r][3] for c in range(len(documents))]
                         for r in range(len(batch))])

    def gap() -> float:
        with torch.no_grad():
            enc = tokenizer(questions + documents, padding=True, truncation=True, max_length=finetune.MAX_TOKENS,
                            return_tensors="pt")
            vectors = finetune.pool(model(**enc).last_hidden_state, enc["attention_mask"])
            logits = (vectors[: len(batch)] @ vectors[len(batch):].T * finetune.SCALE).masked_fill(mask, -1e4)
            return float(finetune.distillation_term(logits, teacher, questions, documents, mask, distill))

    # The term itself: nothing to pull where the student scores as the teacher does; a margin off by 2 costs 2^2.
    asked = torch.tensor(np.stack([teacher[q] for q in questions]))
    taught = (asked @ torch.tensor(np.stack([teacher[d] for d in documents])).T * finetune.TEACHER_SCALE)
    taught = taught.masked_fill(mask, -1e4)
    assert float(finetune.distillation_term(taught, teacher, questions, documents, mask, distill)) < 1e-6
    if distill == "margin":
        shifted = taught.clone()
        shifted[torch.arange(len(batch)), torch.arange(len(batch)) + len(batch)] -= 2.0
        assert abs(float(finetune.distillation_term(shifted, teacher, questions, documents, mask, distill)) - 4.0) < 1e-4

    torch.manual_seed(0)
    before = gap()
    finetune.train(model, tokenizer, list(batch), "cpu", 1, random.Random(0), teacher=teacher, distill_weight=50.0,
                   distill=distill)
    assert gap() < before


def test_teacher_negatives_are_the_teachers_near_misses_never_evidence(tmp_path: Path) -> None:
    """`--teacher-negatives`: each pair's hard negative is one of the teacher's ranks 3-15 among the question's
    non-evidence turns (a stand-in teacher of random vectors, so the ranking is known here)."""
    finetune = script()
    conversations = finetune.load_pairs([f"{one_conversation(tmp_path)}:tuning"])
    conversation = conversations[0]
    teacher = stand_in_teacher(list(conversation["turns"].values()) + [q["q"] for q in conversation["questions"]], seed=1)
    examples = finetune.teacher_triplets(conversations, teacher, random.Random(0))
    assert len(examples) == sum(len(q["evidence"]) for q in conversation["questions"])
    keys = list(conversation["turns"])
    by_question = {q["q"]: q for q in conversation["questions"]}
    for question, positive, negative, evidence in examples:
        evidence_keys = set(by_question[question]["evidence"])
        ranked = sorted((key for key in keys if key not in evidence_keys),
                        key=lambda key: -float(teacher[conversation["turns"][key]] @ teacher[question]))
        near_misses = {conversation["turns"][key] for key in ranked[finetune.HARD_FROM:finetune.HARD_TO]}
        assert negative in near_misses and negative not in evidence and positive in evidence


def test_the_served_pipeline_harness_refuses_conversations_outside_the_tuning_split(tmp_path: Path, capsys) -> None:
    """scripts/served_st_embedder.py scores tuning conversations only, and says which ids it refused."""
    served = script("served_st_embedder")
    (tmp_path / "modules.json").write_text("[]")  # looks like a model folder, so only the split can be refused
    with pytest.raises(SystemExit):
        served.main(["--st-dir", str(tmp_path), "--conversations", "ann-01,ann-05"])
    assert "not in the tuning split of conversations_annotated.json: ann-05" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # a tuning conversation, but no model folder there
        served.main(["--st-dir", str(tmp_path / "missing"), "--conversations", "ann-01"])
    assert "no sentence-transformers model folder" in capsys.readouterr().err
