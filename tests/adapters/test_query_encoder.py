"""chat-mpnet's question sides (AMFS_QUERY_ENCODER): the fast one (seven of chat-mpnet's layers, the top four
retrained) and the mixed one (chat-mpnet itself, every MatMul on dynamic 8-bit kernels), which `auto`
picks on a CPU without VNNI; either embeds the questions, chat-mpnet everything stored."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from amfs_server.adapters import onnx_embedder as onnx_mod
from amfs_server.adapters import embedders as embedders_mod
from amfs_server.adapters.embedders import TwoSidedEmbedder, cpu_has_vnni, load_embedder, resolve_query_encoder
from amfs_server.adapters.onnx_embedder import OnnxEmbedder
from amfs_server.core.embedding import CHAT_MINILM, CHAT_MPNET, CHAT_MPNET_MIXED, CHAT_MPNET_QUERY, EmbedderUnavailableError, embed_queries
from amfs_server.server.settings import load_settings


class Fixed:
    """A test double: every text maps to one fixed unit vector, so which side embedded a text shows."""

    def __init__(self, name: str, vector: list[float]) -> None:
        self.name, self.dimension = name, len(vector)
        self.vector = np.asarray(vector, dtype=np.float32)
        self.loaded = False

    def check_available(self) -> None:
        pass

    def load(self) -> "Fixed":
        self.loaded = True
        return self

    def embed(self, texts):
        return np.tile(self.vector, (len(texts), 1))


def test_questions_go_to_the_query_side_and_everything_else_to_the_document_side() -> None:
    both = TwoSidedEmbedder(Fixed("documents", [1.0, 0.0]), Fixed("questions", [0.0, 1.0]))
    assert (both.name, both.dimension) == ("documents", 2)  # the store records the document side's name
    np.testing.assert_array_equal(both.embed(["a memory"]), [[1.0, 0.0]])
    np.testing.assert_array_equal(embed_queries(both, ["a question?"]), [[0.0, 1.0]])
    assert not both.loaded
    assert both.load() is both and both.loaded


def test_sides_of_different_widths_are_refused() -> None:
    with pytest.raises(ValueError, match="3-d vectors"):
        TwoSidedEmbedder(Fixed("documents", [1.0, 0.0]), Fixed("questions", [0.0, 0.0, 1.0]))


def test_load_embedder_builds_the_fast_side_only_for_chat_mpnet() -> None:
    fast = load_embedder("chat-mpnet", query_encoder="fast")
    assert isinstance(fast, TwoSidedEmbedder) and fast.name == CHAT_MPNET and fast.dimension == 768
    assert fast.queries.name == CHAT_MPNET_QUERY and fast.documents.name == CHAT_MPNET
    assert load_embedder("chat-mpnet", query_encoder="fast") is fast
    assert not isinstance(load_embedder("chat-mpnet", query_encoder="full"), TwoSidedEmbedder)
    with pytest.raises(ValueError, match="has no fast question side"):
        load_embedder("chat-minilm", query_encoder="fast")
    mixed = load_embedder("chat-mpnet", query_encoder="mixed")
    assert isinstance(mixed, TwoSidedEmbedder) and (mixed.name, mixed.queries.name) == (CHAT_MPNET, CHAT_MPNET_MIXED)
    with pytest.raises(ValueError, match="has no mixed question side"):
        load_embedder("chat-minilm", query_encoder="mixed")
    with pytest.raises(ValueError, match="Unknown query encoder 'quick'"):
        load_embedder("chat-mpnet", query_encoder="quick")


def test_a_missing_fast_side_file_says_to_reinstall(monkeypatch, tmp_path) -> None:
    spec = onnx_mod.VARIANTS["chat-mpnet-query-int8"]
    monkeypatch.setitem(onnx_mod.VARIANTS, "chat-mpnet-query-int8",
                        onnx_mod.Variant(spec.name, tmp_path / "gone.onnx.gz", None, spec.hint, dimension=768))
    with pytest.raises(EmbedderUnavailableError, match="does not exist. Reinstall amfs-server"):
        TwoSidedEmbedder(load_embedder("chat-mpnet"), OnnxEmbedder(variant="chat-mpnet-query-int8")).check_available()


@pytest.mark.parametrize("variant", ["chat-mpnet-query-int8", "chat-mpnet-mixed-int8"])
def test_a_question_side_built_against_another_chat_mpnet_file_is_refused(monkeypatch, variant) -> None:
    """Its graph reads chat-mpnet's weights at fixed offsets: after a re-export it would compute nonsense."""
    spec = onnx_mod.VARIANTS[variant]
    monkeypatch.setitem(onnx_mod.VARIANTS, variant, dataclasses.replace(spec, weights_sha256="0" * 64))
    with pytest.raises(EmbedderUnavailableError, match="not the file it was built against"):
        OnnxEmbedder(variant=variant).load()


def test_a_mixed_side_without_its_recipe_says_to_reinstall(monkeypatch, tmp_path) -> None:
    """Its weights are computed at load by the recipe beside its graph: without it there is nothing to run."""
    spec = onnx_mod.VARIANTS["chat-mpnet-mixed-int8"]
    monkeypatch.setitem(onnx_mod.VARIANTS, "chat-mpnet-mixed-int8",
                        dataclasses.replace(spec, requantize=tmp_path / "requantize.json"))
    with pytest.raises(EmbedderUnavailableError, match="requantize.json, which .* needs, is missing; reinstall"):
        OnnxEmbedder(variant="chat-mpnet-mixed-int8").check_available()


@pytest.mark.parametrize(("machine", "flags", "expected"), [
    ("x86_64", "fpu sse2 avx2 fma", False),
    ("x86_64", "fpu avx2 avx512f avx512_vnni", True),
    ("x86_64", "fpu avx2 avx_vnni", True),
    ("aarch64", "fp asimd asimddp", None),
])
def test_vnni_is_read_from_the_cpu_flags(monkeypatch, tmp_path, machine, flags, expected) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nmodel name\t: A CPU\nflags\t\t: {flags}\n\n")
    monkeypatch.setattr("platform.machine", lambda: machine)
    assert cpu_has_vnni(cpuinfo) is expected
    if machine == "x86_64":
        assert cpu_has_vnni(tmp_path / "missing") is None  # unknown, not "no": auto stays on the full side


@pytest.mark.parametrize(("vnni", "expected"), [(False, "mixed"), (True, "full"), (None, "full")])
def test_auto_asks_with_the_mixed_side_only_on_a_cpu_known_to_lack_vnni(monkeypatch, vnni, expected) -> None:
    monkeypatch.setattr(embedders_mod, "cpu_has_vnni", lambda: vnni)
    assert resolve_query_encoder(CHAT_MPNET, "auto") == expected
    assert resolve_query_encoder(CHAT_MINILM, "auto") == "full"  # it has no mixed side
    assert resolve_query_encoder(CHAT_MPNET, "full") == "full" and resolve_query_encoder(CHAT_MPNET, "fast") == "fast"
    # the process-wide embedder of `auto` is the one of what it resolves to, not a third copy
    assert load_embedder("chat-mpnet", query_encoder="auto") is load_embedder("chat-mpnet", query_encoder=expected)
    assert embedders_mod.question_side(load_embedder("chat-mpnet", query_encoder="auto")) == \
        (CHAT_MPNET_MIXED if expected == "mixed" else CHAT_MPNET)


def test_without_a_writable_temp_folder_the_fast_side_says_what_to_set(monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(onnx_mod.tempfile, "mkdtemp", refuse)
    with pytest.raises(EmbedderUnavailableError, match="writable temporary folder.*TMPDIR"):
        OnnxEmbedder(variant="chat-mpnet-query-int8").load()


def test_the_setting_is_read_from_the_environment_and_checked_against_the_embedder() -> None:
    assert load_settings({}).query_encoder == "auto" == embedders_mod.DEFAULT_QUERY_ENCODER
    assert load_settings({"AMFS_QUERY_ENCODER": "fast"}).query_encoder == "fast"
    assert load_settings({"AMFS_QUERY_ENCODER": "mixed"}).query_encoder == "mixed"
    assert load_settings({"AMFS_QUERY_ENCODER": "auto", "AMFS_EMBEDDER": "chat-minilm"}).query_encoder == "auto"
    with pytest.raises(Exception, match="no mixed question side"):
        load_settings({"AMFS_QUERY_ENCODER": "mixed", "AMFS_EMBEDDER": "chat-minilm"})
    assert load_settings({"AMFS_QUERY_ENCODER": "fast", "AMFS_EMBEDDER": "none"}).embedder is None
    with pytest.raises(Exception, match="no fast question side"):
        load_settings({"AMFS_QUERY_ENCODER": "fast", "AMFS_EMBEDDER": "chat-minilm"})
    with pytest.raises(Exception, match="query_encoder"):
        load_settings({"AMFS_QUERY_ENCODER": "turbo"})


def test_the_bundled_fast_side_puts_a_question_near_where_chat_mpnet_does() -> None:
    """The fast side's question vectors point where chat-mpnet's do, and it finds the turn a question asks about
    among chat-mpnet's vectors of the turns."""
    fast = load_embedder("chat-mpnet", query_encoder="fast")
    questions = ["What did Theo name his sourdough starter?", "When is Maya moving to Lisbon?",
                 "Which physio is helping Felix after his back operation?"]
    turns = ["Theo: I named the starter Clint Yeastwood, he gets fed every morning.",
             "Maya: The movers come on the 3rd of June and then it's Lisbon for two years!",
             "Felix: Ruth, my physio, has me walking to the end of the road and back."]
    full_questions = fast.documents.embed(questions)
    fast_questions = embed_queries(fast, questions)
    cosines = (full_questions * fast_questions).sum(axis=1)
    assert cosines.min() > 0.8, cosines
    scores = fast_questions @ fast.embed(turns).T
    assert list(scores.argmax(axis=1)) == [0, 1, 2]


def test_the_bundled_mixed_side_puts_a_question_where_chat_mpnet_does() -> None:
    """The same model on other kernels: its question vectors lie within cosine 0.99 of chat-mpnet's own (0.9946 at
    the least on 781 tuning questions, `scripts/build_mixed_question_side.py --fit`), and it finds the same turns."""
    mixed = load_embedder("chat-mpnet", query_encoder="mixed")
    questions = ["What did Theo name his sourdough starter?", "When is Maya moving to Lisbon?",
                 "Which physio is helping Felix after his back operation?",
                 "How many retries does the payment client make before it gives up?"]
    turns = ["Theo: I named the starter Clint Yeastwood, he gets fed every morning.",
             "Maya: The movers come on the 3rd of June and then it's Lisbon for two years!",
             "Felix: Ruth, my physio, has me walking to the end of the road and back.",
             "payments/retry-policy: the client retries a declined authorisation 3 times, 2 s apart"]
    cosines = (mixed.documents.embed(questions) * embed_queries(mixed, questions)).sum(axis=1)
    assert cosines.min() > 0.99, cosines
    scores = embed_queries(mixed, questions) @ mixed.embed(turns).T
    assert list(scores.argmax(axis=1)) == [0, 1, 2, 3]


def test_a_server_configured_fast_writes_chat_mpnet_vectors_and_asks_with_the_fast_side(tmp_path) -> None:
    import asyncio

    from amfs_server.core.models import Actor
    from amfs_server.core.service import WriteRequest
    from amfs_server.server.composition import build_service

    settings = load_settings({"AMFS_DATA_DIR": str(tmp_path), "AMFS_QUERY_ENCODER": "fast"})
    service = build_service(settings)
    assert isinstance(service.embedder, TwoSidedEmbedder) and service.embedder.name == CHAT_MPNET
    actor = Actor("agent/test", "s1")

    async def run():
        await service.open()
        try:
            await service.write(actor, WriteRequest("chat/maya-theo", "D1:4", "Theo: I named the starter Clint Yeastwood."))
            await service.write(actor, WriteRequest("chat/maya-theo", "D1:5", "Maya: The movers come on the 3rd of June."))
            found = await service.retrieve(actor, "What is the sourdough starter called?", entity_path="chat/maya-theo")
            return [hit.entry.key for hit in found]
        finally:
            await service.close()

    assert asyncio.run(run())[0] == "D1:4"


def test_a_server_says_which_side_it_asks_with_once_its_embedder_is_loaded(caplog) -> None:
    """`auto` picks the question side by the CPU, so the server names the one it picked."""
    import asyncio
    import logging
    from types import SimpleNamespace

    from amfs_server.server.app import _warm_up_embedder

    both = TwoSidedEmbedder(Fixed(CHAT_MPNET, [1.0, 0.0]), Fixed(CHAT_MPNET_MIXED, [0.0, 1.0]))

    async def warm() -> None:
        task = _warm_up_embedder(SimpleNamespace(embedder=both))
        assert task is not None
        await task

    with caplog.at_level(logging.INFO, logger="amfs_server.server"):
        asyncio.run(warm())
    assert f"Embedder {CHAT_MPNET} loaded; questions embedded by {CHAT_MPNET_MIXED}" in caplog.text
    assert both.loaded
