"""A store records which embedder made its vectors; a server configured for another one refuses it with the
command that re-embeds it (`amfs-server memory reembed`), and that command makes the store usable again.

Unit tests use deterministic hash embedders (test doubles; one of another width, which a PostgreSQL store's vector
column changes to) on real stores (`[sqlite]`, `[postgres]`), reopened between steps as a restarted server would; the
SQLite CLI test uses the real default (ONNX) embedder, the PostgreSQL one stand-ins under the bundled names."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from amfs_server.adapters.sqlite import SQLiteStore
from amfs_server.core.embedding import CHAT_MINILM, DEFAULT_EMBEDDER, ENTRY_VECTORS, MINILM_INT8, TORCH_MINILM
from amfs_server.core.errors import StoreError
from amfs_server.core.models import Actor, EntryFilter, utcnow
from amfs_server.core.service import EMBEDDER_META, MemoryService, WriteRequest
from amfs_server.server.cli import cli

ACTOR = Actor("agent/test", "embedder-record")


class SeededHashEmbedder:
    """Unit vectors from a text's hash; a different `seed` is a different model (unrelated vectors)."""

    def __init__(self, name: str, seed: int, dimension: int = 384) -> None:
        self.name, self.seed, self.dimension = name, seed, dimension

    def embed(self, texts: list[str]) -> np.ndarray:
        rows = []
        for text in texts:
            digest = hashlib.blake2b(f"{self.seed}:{text}".encode(), digest_size=8).digest()
            row = np.random.default_rng(int.from_bytes(digest, "little")).standard_normal(self.dimension)
            rows.append((row / np.linalg.norm(row)).astype(np.float32))
        return np.stack(rows) if rows else np.empty((0, self.dimension), dtype=np.float32)


MODEL_A = SeededHashEmbedder("model-a", 1)
MODEL_B = SeededHashEmbedder("model-b", 2)
WIDE = SeededHashEmbedder("model-wide", 3, dimension=768)  # another width, as chat-mpnet after chat-MiniLM-L6


StoreFactory = Callable[..., object]  # the conftest `make_store` fixture


async def open_service(make_store: StoreFactory, embedder: SeededHashEmbedder | None, check: bool = True) -> MemoryService:
    service = MemoryService(make_store(None if embedder is None else embedder.dimension), embedder=embedder)
    await service.open(check_embedder=check)
    return service


async def store_written_by(make_store: StoreFactory, embedder: SeededHashEmbedder, *, record: bool = True) -> None:
    service = await open_service(make_store, embedder)
    await service.write(ACTOR, WriteRequest("svc/payments", "retry-policy", "retry the card authorisation 3 times"))
    await service.write(ACTOR, WriteRequest("svc/payments", "timeout", "gateway timeout is 30 seconds"))
    if not record:  # what a store written before the record existed looks like
        await service.store.set_meta(EMBEDDER_META, None)
    await service.close()


async def test_a_new_store_records_the_configured_embedder(make_store: StoreFactory) -> None:
    service = await open_service(make_store, MODEL_A)
    assert await service.store.get_meta(EMBEDDER_META) == "model-a"
    await service.close()


async def test_a_store_made_by_another_embedder_is_refused_with_the_reembed_command_and_left_unchanged(
    make_store: StoreFactory,
) -> None:
    await store_written_by(make_store, MODEL_A)
    with pytest.raises(StoreError) as refused:
        await open_service(make_store, MODEL_B)
    message = str(refused.value)
    assert "'model-a'" in message and "'model-b'" in message
    assert "amfs-server memory reembed" in message and "AMFS_EMBEDDER=model-a" in message
    service = await open_service(make_store, MODEL_A)  # still the model-a store it was
    assert await service.store.get_meta(EMBEDDER_META) == "model-a"
    hits = await service.retrieve(ACTOR, "retry the card authorisation 3 times", limit=1)
    assert hits[0].entry.key == "retry-policy"
    await service.close()


async def test_a_store_of_the_retired_default_is_refused_with_only_the_reembed_command(make_store: StoreFactory) -> None:
    """0.3.2's default (all-MiniLM-L6-v2-onnx-int8) is no longer bundled: keeping it is no option to offer."""
    retired = SeededHashEmbedder(MINILM_INT8, 1)
    await store_written_by(make_store, retired)
    with pytest.raises(StoreError) as refused:
        await open_service(make_store, MODEL_B)
    message = str(refused.value)
    assert f"'{MINILM_INT8}'" in message and "no longer bundled" in message and "amfs-server memory reembed" in message
    assert "AMFS_EMBEDDER=" not in message
    service = await open_service(make_store, retired)  # left as it was
    assert await service.store.get_meta(EMBEDDER_META) == MINILM_INT8
    await service.close()


async def test_a_store_without_vectors_accepts_any_embedder(make_store: StoreFactory) -> None:
    await (await open_service(make_store, None)).close()
    service = await open_service(make_store, MODEL_B)
    assert await service.store.get_meta(EMBEDDER_META) == "model-b"
    await service.close()


async def test_an_unrecorded_store_whose_vectors_match_the_embedder_gets_the_record(make_store: StoreFactory) -> None:
    await store_written_by(make_store, MODEL_A, record=False)
    service = await open_service(make_store, MODEL_A)
    assert await service.store.get_meta(EMBEDDER_META) == "model-a"
    await service.close()


async def test_an_unrecorded_store_whose_vectors_do_not_match_is_taken_for_the_old_torch_default(make_store: StoreFactory) -> None:
    await store_written_by(make_store, MODEL_A, record=False)
    with pytest.raises(StoreError, match=rf"made by the embedder '{TORCH_MINILM}'.*pip install .\.\[lm\]. \(in the amfs-server checkout\)"):
        await open_service(make_store, MODEL_B)


async def test_clear_keeps_the_record_so_later_vectors_are_not_taken_for_unrecorded_ones(make_store: StoreFactory) -> None:
    service = await open_service(make_store, MODEL_A)
    await service.clear()
    assert await service.store.get_meta(EMBEDDER_META) == "model-a"
    await service.close()


async def test_a_clear_without_an_embedder_keeps_the_record_so_another_embedder_is_still_refused(
    make_store: StoreFactory,
) -> None:
    """`amfs-server memory clear` runs without an embedder; it deleted the record, and a server configured for
    another embedder then opened the store beside one still writing the first's vectors (a red-team finding)."""
    service = await open_service(make_store, MODEL_A)
    await service.close()
    cli_like = MemoryService(make_store(), embedder=None)
    await cli_like.open()
    await cli_like.clear()
    await cli_like.close()
    with pytest.raises(StoreError, match="model-a"):
        await open_service(make_store, MODEL_B)


async def test_reembed_replaces_every_version_vector_and_records_the_new_embedder(make_store: StoreFactory) -> None:
    await store_written_by(make_store, MODEL_A)
    service = await open_service(make_store, MODEL_B, check=False)
    await service.write(ACTOR, WriteRequest("svc/payments", "retry-policy", "retry the card authorisation 5 times"))
    backups = []
    assert await service.reembed(before_clear=backups.append) == 3
    assert len(backups[0].entries) == 3  # the original store, handed over before anything is cleared
    await service.close()

    service = await open_service(make_store, MODEL_B)  # no longer refused
    assert await service.store.get_meta(EMBEDDER_META) == "model-b"
    versions = await service.store.history("svc/payments", "retry-policy")
    expected = MODEL_B.embed(["svc payments retry policy: retry the card authorisation 3 times"])[0]
    assert np.allclose(versions[0].embedding, expected, atol=1e-6)
    # The vector index serves the new vectors: model-b's vector of an entry's text finds that entry first.
    probe = MODEL_B.embed(["svc payments timeout: gateway timeout is 30 seconds"])[0].tolist()
    nearest = await service.store.semantic_candidates(probe, EntryFilter(), utcnow(), 1)
    assert nearest[0][0].key == "timeout" and nearest[0][1] == pytest.approx(1.0, abs=1e-5)
    await service.close()


def test_memory_reembed_command_moves_a_store_to_the_default_embedder(tmp_path: Path, monkeypatch) -> None:
    import asyncio

    data_dir = tmp_path / "store"
    data_dir.mkdir()
    asyncio.run(store_written_by(lambda dimension=384: SQLiteStore(data_dir / "amfs.db"), MODEL_A))
    monkeypatch.setenv("AMFS_DATA_DIR", str(data_dir))
    monkeypatch.delenv("AMFS_EMBEDDER", raising=False)
    monkeypatch.delenv("AMFS_POSTGRES_DSN", raising=False)

    refused = CliRunner().invoke(cli, ["memory", "show"])  # inspection needs no embedder: still works
    assert refused.exit_code == 0, refused.output
    backup = tmp_path / "backup.json"
    result = CliRunner().invoke(cli, ["memory", "reembed", "--backup", str(backup)])
    assert result.exit_code == 0, result.output
    assert f"Re-embedded 2 entry versions with {DEFAULT_EMBEDDER}" in result.output
    assert '"retry-policy"' in backup.read_text()

    async def reopen() -> str:
        from amfs_server.adapters.embedders import load_embedder

        service = MemoryService(SQLiteStore(data_dir / "amfs.db"), embedder=load_embedder())
        await service.open()
        try:
            hits = await service.retrieve(ACTOR, "how long until the payment gateway times out?", limit=1)
            return hits[0].entry.key
        finally:
            await service.close()

    assert asyncio.run(reopen()) == "timeout"
    # Without --backup the export taken first guards the re-embed only: gone from the data directory afterwards,
    # where no later forget could reach it (red-team repro: a forgotten memory survived in it).
    # One a crashed re-embed left (killed after its backup, before the store was replaced) goes with the next success.
    # So does the part-written temporary of a backup whose run was killed while writing it (red-team repro, 0.7.15),
    # and `memory forget` says where such copies may still hold what it forgot.
    crashed = data_dir / "before-reembed-20261130T114500Z.json"
    crashed.write_text('{"a copy": "of a memory forgotten since"}')
    part = data_dir / ".before-reembed-20261130T120000Z.json.0a1b2c3d.tmp"
    part.write_text('{"a part-written copy": "of a memory')
    forgot = CliRunner().invoke(cli, ["memory", "forget", "svc/payments/retry-policy"])
    assert forgot.exit_code == 0, forgot.output
    assert "2 re-embed backup file(s)" in forgot.output and part.name in forgot.output and crashed.name in forgot.output
    again = CliRunner().invoke(cli, ["memory", "reembed"])
    assert again.exit_code == 0, again.output
    assert "the backup taken first was removed" in again.output
    assert "2 left by an earlier re-embed that did not finish were removed" in again.output
    assert sorted(p.name for p in data_dir.iterdir() if "before-reembed" in p.name) == []
    forgot = CliRunner().invoke(cli, ["memory", "forget", "svc/payments/timeout"])
    assert forgot.exit_code == 0 and "backup" not in forgot.output, forgot.output


async def refused_then_reembedded(make_store: StoreFactory, why: str, versions: int) -> MemoryService:
    """Opening the store is refused for `why` with the re-embed command; `reembed` (the command's engine) redoes
    `versions` versions; then it opens, recording this release's way of making vectors. Returns it open."""
    from amfs_server.core.service import ENTRY_VECTORS_META

    with pytest.raises(StoreError, match=why + r".*amfs-server memory reembed"):
        await open_service(make_store, MODEL_A)
    service = await open_service(make_store, MODEL_A, check=False)
    assert await service.reembed() == versions
    await service.close()
    service = await open_service(make_store, MODEL_A)  # accepted now
    assert await service.store.get_meta(ENTRY_VECTORS_META) == ENTRY_VECTORS
    return service


async def test_a_store_of_whole_entry_vectors_from_an_earlier_release_is_refused_until_reembedded(
    make_store: StoreFactory,
) -> None:
    from amfs_server.core.embedding import embedding_text
    from amfs_server.core.service import ENTRY_VECTORS_META

    # What an earlier amfs-server left: each entry's whole text embedded once, the embedder recorded, no scheme.
    service = await open_service(make_store, MODEL_A)
    text = "Retry the card authorisation 3 times. Then give up and page on-call."
    await service.write(ACTOR, WriteRequest("svc/payments", "retry-policy", text))
    whole = MODEL_A.embed([embedding_text("svc/payments", "retry-policy", text)])[0]
    entry = await service.store.get_current("svc/payments", "retry-policy", service.now())
    assert entry is not None and not np.allclose(entry.embedding, whole, atol=1e-3)  # two sentences: joined now
    await service.reembed()
    await service.store.set_meta(ENTRY_VECTORS_META, None)
    snapshot = await service.store.export_snapshot()
    await service.store.clear()
    await service.store.import_snapshot(replace(snapshot, entries=[
        e.with_changes(embedding=whole.tolist()) for e in snapshot.entries], meta={EMBEDDER_META: "model-a"}))
    await service.close()

    service = await refused_then_reembedded(make_store, r"from whole entries", versions=1)
    await service.close()


@pytest.mark.parametrize("recorded", [True, False], ids=["scheme recorded", "no record"])
async def test_a_store_of_sentence_means_without_passage_vectors_is_refused_until_reembedded(
    make_store: StoreFactory, recorded: bool,
) -> None:
    from amfs_server.core.service import ENTRY_VECTORS_META

    # What the release before passage vectors left: the same mean vectors, no passage vectors, scheme "sentence-mean".
    service = await open_service(make_store, MODEL_A)
    text = "Retry the card authorisation 3 times. Then give up and page on-call."
    await service.write(ACTOR, WriteRequest("svc/payments", "retry-policy", text))
    await service.write(ACTOR, WriteRequest("svc/payments", "timeout", "gateway timeout is 30 seconds"))
    snapshot = await service.store.export_snapshot()
    assert [e.passage_embeddings is not None for e in snapshot.entries] == [True, False]  # two sentences, one
    await service.store.clear()
    meta = {EMBEDDER_META: "model-a", ENTRY_VECTORS_META: "sentence-mean"} if recorded else {}
    await service.store.import_snapshot(replace(snapshot, entries=[
        e.with_changes(passage_embeddings=None) for e in snapshot.entries], meta=meta))
    await service.close()

    service = await refused_then_reembedded(make_store, r"without the sentence vectors", versions=2)
    again = await service.store.export_snapshot()  # the passages back
    assert [e.passage_embeddings for e in again.entries] == [e.passage_embeddings for e in snapshot.entries]
    await service.close()


async def test_a_store_of_turns_embedded_under_their_ids_is_refused_until_reembedded(make_store: StoreFactory) -> None:
    from amfs_server.core.embedding import EntryTexts, embed_entries, embedding_text
    from amfs_server.core.service import ENTRY_VECTORS_META

    # What an earlier release left: a transcript turn's sentences embedded under its path and key.
    service = await open_service(make_store, MODEL_A)
    turn = "Jonah: Back from Kyoto! The bamboo forest was unreal."
    await service.write(ACTOR, WriteRequest("chat/c1", "t1", turn))
    snapshot = await service.store.export_snapshot()
    old = embed_entries(MODEL_A.embed, [EntryTexts(embedding_text("chat/c1", "t1", turn), [
        embedding_text("chat/c1", "t1", "Jonah: Back from Kyoto!"),
        embedding_text("chat/c1", "t1", "Jonah: The bamboo forest was unreal.")])])
    await service.store.clear()
    await service.store.import_snapshot(replace(
        snapshot, entries=[e.with_changes(embedding=old.vectors[0].tolist(), passage_embeddings=old.passages[0].tolist())
                           for e in snapshot.entries],
        meta={EMBEDDER_META: "model-a", ENTRY_VECTORS_META: "sentence-mean+passages"}))
    await service.close()

    service = await refused_then_reembedded(make_store, r"under their entity path and key", versions=1)
    again = (await service.store.export_snapshot()).entries
    assert np.allclose(again[0].embedding, snapshot.entries[0].embedding, atol=1e-6)  # the vectors of this release
    await service.close()


async def test_a_store_of_0_4_0_sentence_mean_vectors_is_refused_until_reembedded(make_store: StoreFactory) -> None:
    from amfs_server.core.embedding import EntryTexts, embed_entries, entry_texts
    from amfs_server.core.service import ENTRY_VECTORS_META

    # What 0.4.0 left: a several-sentence entry's vector was its sentences' mean, without its whole text's embedding.
    service = await open_service(make_store, MODEL_A)
    turn = "Jonah: Back from Kyoto! The bamboo forest was unreal."
    await service.write(ACTOR, WriteRequest("chat/c1", "t1", turn))
    snapshot = await service.store.export_snapshot()
    sentences = entry_texts("chat/c1", "t1", turn).sentences
    mean = MODEL_A.embed(sentences).mean(axis=0)
    await service.store.clear()
    await service.store.import_snapshot(replace(
        snapshot, entries=[e.with_changes(embedding=(mean / np.linalg.norm(mean)).tolist()) for e in snapshot.entries],
        meta={EMBEDDER_META: "model-a", ENTRY_VECTORS_META: "sentence-mean+passages+turn-header"}))
    await service.close()

    service = await refused_then_reembedded(make_store, r"made of its sentences alone", versions=1)
    again = (await service.store.export_snapshot()).entries
    joined = embed_entries(MODEL_A.embed, [EntryTexts(f"chat message: {turn}", sentences)]).vectors[0]
    assert np.allclose(again[0].embedding, joined, atol=1e-6) and np.allclose(snapshot.entries[0].embedding, joined, atol=1e-6)
    await service.close()


def test_an_entry_vector_joins_its_whole_text_and_its_sentences_each_with_the_header_and_speaker() -> None:
    from amfs_server.core.embedding import MAX_PASSAGES, EntryTexts, embed_entries, entry_texts

    # A transcript turn keyed by a turn id: the whole turn and each sentence under the fixed turn header with its
    # speaker, whatever its path and id.
    turn = "Jonah: Ugh, Mondays. Meet Taco, my new kitten! She is a Maine Coon."
    assert entry_texts("chat/c1", "t7", turn) == EntryTexts(f"chat message: {turn}", [
        "chat message: Jonah: Ugh, Mondays.", "chat message: Jonah: Meet Taco, my new kitten!",
        "chat message: Jonah: She is a Maine Coon."])
    assert entry_texts("users/ana/3f2a9c0e", "D25:11", turn) == entry_texts("chat/c1", "t7", turn)
    assert entry_texts("chat/c1", "t8", "Felix: Cute!") == EntryTexts("chat message: Felix: Cute!", [])
    # A labelled note keyed by words is no turn id: it keeps the path and key that name its topic.
    assert entry_texts("ops/deploys", "deploy-process", "Deploys: Tuesdays only. Never on a Friday.").sentences == [
        "ops deploys deploy process: Deploys: Tuesdays only.", "ops deploys deploy process: Deploys: Never on a Friday."]
    # Anything else: under its own path and key.
    assert entry_texts("svc/payments", "timeout", "gateway timeout is 30 seconds") == EntryTexts(
        "svc payments timeout: gateway timeout is 30 seconds", [])  # one sentence: the whole text alone
    assert entry_texts("svc/x", "k", {"summary": "One. Two."}) == EntryTexts("svc x k: One. Two.", [])  # structured
    many = entry_texts("doc", "long", " ".join(f"Sentence {i}." for i in range(50))).sentences
    assert 1 < len(many) <= MAX_PASSAGES and "Sentence 0." in many[0] and "Sentence 49." in many[-1]

    made = embed_entries(MODEL_A.embed, [EntryTexts("x: a. b.", ["a. ", "b."]), EntryTexts("c", [])])
    sentences = MODEL_A.embed(["a. ", "b."]).mean(axis=0)
    expected = MODEL_A.embed(["x: a. b."])[0] + sentences / np.linalg.norm(sentences)
    assert np.allclose(made.vectors[0], expected / np.linalg.norm(expected), atol=1e-6)
    assert np.allclose(made.vectors[1], MODEL_A.embed(["c"])[0], atol=1e-6)
    assert np.allclose(np.linalg.norm(made.vectors, axis=1), 1.0, atol=1e-5)
    # The sentences are kept for the second look (one sentence: none, its embedding is the entry vector).
    assert np.allclose(made.passages[0], MODEL_A.embed(["a. ", "b."]), atol=1e-6) and made.passages[1] is None


async def test_turns_written_with_many_in_flight_borrow_the_turn_sent_before_them(make_store: StoreFactory) -> None:
    """An outside harness sending eight writes at a time (asyncio.gather) had its turns borrow whatever turn had
    committed meanwhile: -0.015 recall@10 on the fresh set. Writes of turns to one path now run in arrival order."""
    import asyncio

    service = await open_service(make_store, MODEL_A)
    speakers = ["Ana", "Ben"]
    keys = [f"D1:{n}" for n in range(1, 13)]
    await asyncio.gather(*(service.write(ACTOR, WriteRequest("chat/c1", key, f"{speakers[n % 2]}: turn number {n}."))
                           for n, key in enumerate(keys)))
    await asyncio.gather(*(service.write(ACTOR, WriteRequest("chat/c2", key, f"Ana: other chat {n}."))
                           for n, key in enumerate(keys[:3])))  # another path, in flight beside it
    entries = {(e.entity_path, e.key): e for e in (await service.store.export_snapshot()).entries}
    assert [entries[("chat/c1", key)].context_key for key in keys] == [None, *keys[:-1]]
    assert [entries[("chat/c2", key)].context_key for key in keys[:3]] == [None, *keys[:2]]
    assert service._write_order == {}  # no lock outlives the writes


async def test_reembed_makes_the_context_passages_the_writes_made(make_store: StoreFactory) -> None:
    service = await open_service(make_store, MODEL_A)
    turns = ["Jonah: We want to skydive for my birthday!", "Felix: Count me out. I get dizzy.", "Jonah: Fair enough."]
    for number, text in enumerate(turns, start=1):  # one at a time, as a client writes a conversation
        await service.write(ACTOR, WriteRequest("chat/c1", f"t{number}", text))
    await service.write_many(ACTOR, [WriteRequest("chat/c2", "a2", "Ben: How was it?"),
                                     WriteRequest("chat/c2", "a1", "Ana: Back from Porto!")])  # one batch: key order
    await service.write(ACTOR, WriteRequest("svc/payments", "timeout", "gateway timeout is 30 seconds"))
    await service.write(ACTOR, WriteRequest("chat/c1", "t2", "Felix: Count me out, sorry."))  # a new version
    before = (await service.store.export_snapshot()).entries
    written = {(e.entity_path, e.key, e.version): e.passage_embeddings for e in before}
    t2 = "chat message: Jonah: We want to skydive for my birthday! Felix: Count me out. I get dizzy."
    assert np.allclose(written[("chat/c1", "t2", 1)][-1], MODEL_A.embed([t2])[0], atol=1e-6)  # the context, last
    assert written[("chat/c1", "t1", 1)] is None  # the first turn has no turn before it
    a2 = "chat message: Ana: Back from Porto! Ben: How was it?"  # a batch shares one time: taken in key order
    assert np.allclose(written[("chat/c2", "a2", 1)][-1], MODEL_A.embed([a2])[0], atol=1e-6)
    assert written[("svc/payments", "timeout", 1)] is None  # not a transcript turn
    # The new version of t2 was written after t3: its context is t3.
    newer = "chat message: Jonah: Fair enough. Felix: Count me out, sorry."
    assert np.allclose(written[("chat/c1", "t2", 2)][-1], MODEL_A.embed([newer])[0], atol=1e-6)
    assert await service.reembed() == 7
    after = (await service.store.export_snapshot()).entries
    again = {(e.entity_path, e.key, e.version): e.passage_embeddings for e in after}
    assert [e.context_key for e in after] == [e.context_key for e in before]
    assert {(e.key, e.version): e.context_key for e in before if e.entity_path == "chat/c1"} == {
        ("t1", 1): None, ("t2", 1): "t1", ("t3", 1): "t2", ("t2", 2): "t3"}
    assert again.keys() == written.keys()
    for version, rows in written.items():
        assert (rows is None) == (again[version] is None), version
        if rows is not None:
            assert np.allclose(rows, again[version], atol=1e-6), version
    await service.close()


async def test_a_turn_after_a_memory_with_a_ttl_takes_no_passage_from_it_on_write_or_reembed(make_store: StoreFactory) -> None:
    """An expired turn's words kept ranking the next turn (1st for a question only the expired turn answered) until
    the expiry sweep erased them (red-team finding, 0.7.15): a memory with a TTL lends no context passage."""
    service = await open_service(make_store, MODEL_A)
    await service.write(ACTOR, WriteRequest("chat/c1", "t1", "Ana: We talked about the weather."))
    await service.write(ACTOR, WriteRequest("chat/c1", "t2", "Ben: My dog is called Biscuit.", ttl_seconds=3600))
    await service.write(ACTOR, WriteRequest("chat/c1", "t3", "Ana: Oh nice, that is lovely."))
    await service.write_many(ACTOR, [WriteRequest("chat/c2", "a1", "Ana: A secret for an hour.", ttl_seconds=3600),
                                     WriteRequest("chat/c2", "a2", "Ben: Noted.")])  # within one batch too
    await service.write(ACTOR, WriteRequest("chat/c1", "t4", "Ben: Yes, very."))
    contexts = {(e.entity_path, e.key): e.context_key for e in (await service.store.export_snapshot()).entries}
    assert contexts == {("chat/c1", "t1"): None, ("chat/c1", "t2"): "t1", ("chat/c1", "t3"): None,
                        ("chat/c1", "t4"): "t3", ("chat/c2", "a1"): None, ("chat/c2", "a2"): None}
    await service.reembed()
    assert {(e.entity_path, e.key): e.context_key for e in (await service.store.export_snapshot()).entries} == contexts
    await service.close()


# -- a change of vector width (chat-MiniLM-L6's 384 to chat-mpnet's 768): a PostgreSQL column's width changes too --

async def vector_column(store: Any) -> tuple[int | None, str | None]:
    """A PostgreSQL store's `embedding` width and its HNSW index's definition (None: no index)."""

    async def read(conn: Any) -> tuple[int | None, str | None]:
        index = await conn.fetchval(
            "SELECT indexdef FROM pg_indexes WHERE schemaname = $1 AND indexname = 'entries_embedding_hnsw'",
            store.schema)
        return await store._column_width(conn), index

    return await store._read(read)


def without_vectors(snapshot: Any) -> list[Any]:
    return [e.with_changes(embedding=None, passage_embeddings=None) for e in snapshot.entries]


async def test_reembed_moves_a_store_to_an_embedder_of_another_width(make_store: StoreFactory) -> None:
    service = await open_service(make_store, MODEL_A)
    await service.write(ACTOR, WriteRequest("svc/payments", "retry-policy", "retry the card authorisation 3 times"))
    await service.write(ACTOR, WriteRequest("svc/payments", "retry-policy", "retry the card authorisation 5 times"))
    await service.write(Actor("agent/other", "s2"), WriteRequest("svc/payments", "timeout", "gateway timeout is 30 seconds"))
    await service.write(ACTOR, WriteRequest("chat/c1", "t1", "Jonah: Back from Kyoto! The bamboo forest was unreal."))
    before = await service.store.export_snapshot()
    await service.close()

    with pytest.raises(StoreError) as refused:  # the server start names both fixes, and leaves the store as it was
        await open_service(make_store, WIDE)
    assert "amfs-server memory reembed" in str(refused.value) and "AMFS_EMBEDDER=model-a" in str(refused.value)
    service = await open_service(make_store, WIDE, check=False)  # as `amfs-server memory reembed` opens it
    assert await service.reembed() == 4
    await service.close()

    service = await open_service(make_store, WIDE)  # no longer refused
    after = await service.store.export_snapshot()
    assert [len(e.embedding) for e in after.entries] == [768] * 4
    assert {np.asarray(e.passage_embeddings).shape[1] for e in after.entries if e.passage_embeddings} == {768}
    assert without_vectors(after) == without_vectors(before)  # values, versions, provenance, confidence as they were
    assert after.meta[EMBEDDER_META] == "model-wide"
    probe = WIDE.embed(["svc payments timeout: gateway timeout is 30 seconds"])[0].tolist()
    nearest = await service.store.semantic_candidates(probe, EntryFilter(), utcnow(), 1)
    assert nearest[0][0].key == "timeout" and nearest[0][1] == pytest.approx(1.0, abs=1e-5)
    hits = await service.retrieve(ACTOR, "gateway timeout is 30 seconds", limit=1)
    assert hits[0].entry.key == "timeout"
    await service.write(ACTOR, WriteRequest("svc/payments", "currency", "charges are in EUR"))  # writes go on
    if not isinstance(service.store, SQLiteStore):
        width, index = await vector_column(service.store)
        assert width == 768 and index is not None and "hnsw" in index and "WHERE is_current" in index
    await service.close()


@pytest.mark.parametrize("store", ["postgres"], indirect=True)
async def test_the_refusal_of_another_width_names_the_reembed_command_and_the_old_embedder(
    make_store: StoreFactory,
) -> None:
    await store_written_by(make_store, SeededHashEmbedder(CHAT_MINILM, 1))
    with pytest.raises(StoreError) as refused:
        await open_service(make_store, WIDE)
    message = str(refused.value)
    assert "holds embeddings of dimension 384 (made by 'chat-MiniLM-L6-onnx-int8')" in message
    assert "gives 768, so nothing was changed" in message
    assert "`amfs-server memory reembed` (every version and the vector column's width, in place" in message
    assert "backup file" in message
    assert "stop the other servers on this store first" in message
    assert f"AMFS_EMBEDDER={CHAT_MINILM}" in message and "cannot be re-embedded" not in message


@pytest.mark.parametrize("store", ["postgres"], indirect=True)
async def test_a_width_change_that_fails_leaves_the_store_at_its_old_width_with_its_vectors(
    make_store: StoreFactory, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from amfs_server.adapters.postgres import PostgresStore

    await store_written_by(make_store, MODEL_A)
    service = await open_service(make_store, WIDE, check=False)
    before = await service.store.export_snapshot()
    widths: list[int | None] = []

    async def fail_after_the_alter(self: PostgresStore, conn: Any, pairs: object) -> None:
        widths.append(await self._column_width(conn))  # in the replacing transaction, before the import's rows
        raise RuntimeError("injected failure during the import")

    with monkeypatch.context() as patch:
        patch.setattr(PostgresStore, "_lock_keys", fail_after_the_alter)
        with pytest.raises(RuntimeError, match="injected"):
            await service.reembed()
    assert widths == [768]  # the column had been changed when the import failed
    await service.close()

    with pytest.raises(StoreError, match="dimension 384"):  # still the old store: the new embedder is refused
        await open_service(make_store, WIDE)
    service = await open_service(make_store, MODEL_A)
    assert await service.store.export_snapshot() == before  # every vector as it was
    width, index = await vector_column(service.store)
    assert width == 384 and index is not None
    hits = await service.retrieve(ACTOR, "retry the card authorisation 3 times", limit=1)
    assert hits[0].entry.key == "retry-policy"
    await service.close()


@pytest.mark.parametrize("store", ["postgres"], indirect=True)
async def test_a_server_left_running_through_a_width_change_is_stopped_at_its_next_vector_with_the_reason(
    make_store: StoreFactory,
) -> None:
    from amfs_server.core.errors import ConflictError

    old = await open_service(make_store, MODEL_A)  # a server still running on the 384-wide store
    await old.write(ACTOR, WriteRequest("svc/payments", "retry-policy", "retry the card authorisation 3 times"))
    service = await open_service(make_store, WIDE, check=False)
    embed = service._entry_vectors

    async def embed_while_the_old_server_writes(*args: object, **kwargs: object) -> object:
        await old.write(ACTOR, WriteRequest("svc/payments", "timeout", "gateway timeout is 30 seconds"))
        return await embed(*args, **kwargs)

    service._entry_vectors = embed_while_the_old_server_writes
    with pytest.raises(ConflictError, match="nothing was replaced"):  # caught before any change of width
        await service.reembed()
    assert (await vector_column(service.store))[0] == 384
    assert len((await old.store.export_snapshot()).entries) == 2

    service._entry_vectors = embed
    assert await service.reembed() == 2
    for attempt in (lambda: old.write(ACTOR, WriteRequest("svc/payments", "currency", "charges are in EUR")),
                    lambda: old.retrieve(ACTOR, "gateway timeout", limit=1)):
        with pytest.raises(StoreError, match=r"now holds embeddings of dimension 768, but this server's embedder "
                                             r"gives 384: it was re-embedded \(`amfs-server memory reembed`\).*Restart"):
            await attempt()
    snapshot = await service.store.export_snapshot()
    assert [e.key for e in snapshot.entries] == ["retry-policy", "timeout"]  # nothing of the old width written
    await old.close()
    await service.close()


def bundled_stand_ins(monkeypatch: pytest.MonkeyPatch) -> tuple[SeededHashEmbedder, SeededHashEmbedder]:
    """Stand-ins under the bundled names (chat-MiniLM-L6's 384 wide, the default's 768), so the commands run as
    shipped without loading either model; the default embedder is configured (AMFS_EMBEDDER unset)."""
    from amfs_server.adapters import embedders

    previous, default = SeededHashEmbedder(CHAT_MINILM, 1), SeededHashEmbedder(DEFAULT_EMBEDDER, 2, dimension=768)
    monkeypatch.setitem(embedders._cache, (CHAT_MINILM, None), previous)
    monkeypatch.setitem(embedders._cache, (DEFAULT_EMBEDDER, None), default)
    monkeypatch.delenv("AMFS_EMBEDDER", raising=False)
    return previous, default


def use_postgres_store(store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Point the commands at the `store` fixture's PostgreSQL schema (AMFS_POSTGRES_DSN with its search path)."""
    from urllib.parse import quote

    monkeypatch.setenv("AMFS_POSTGRES_DSN", store.dsn + ("&" if "?" in store.dsn else "?")
                       + "options=" + quote(f"-csearch_path={store.schema}", safe=""))


async def run(*args: str) -> Any:
    """`amfs-server ARGS` off the test's event loop (the command runs its own)."""
    import asyncio

    return await asyncio.to_thread(CliRunner().invoke, cli, list(args))


@pytest.mark.parametrize("store", ["postgres"], indirect=True)
async def test_memory_reembed_command_moves_a_postgres_store_to_the_default_embedders_width(
    store: Any, make_store: StoreFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    previous, default = bundled_stand_ins(monkeypatch)
    await store_written_by(make_store, previous)
    monkeypatch.setenv("AMFS_DATA_DIR", str(tmp_path / "data"))
    use_postgres_store(store, monkeypatch)

    refused = await run("memory", "search", "gateway timeout")
    assert refused.exit_code == 1 and "Traceback" not in refused.output
    assert "holds embeddings of dimension 384" in refused.output and "`amfs-server memory reembed`" in refused.output
    assert f"AMFS_EMBEDDER={CHAT_MINILM}" in refused.output
    shown = await run("memory", "show")  # inspection needs no embedder, whatever the store's width
    assert shown.exit_code == 0 and "svc/payments/timeout v1" in shown.output, shown.output

    backup = tmp_path / "backup.json"
    result = await run("memory", "reembed", "--backup", str(backup))
    assert result.exit_code == 0, result.output
    assert f"Re-embedded 2 entry versions with {DEFAULT_EMBEDDER}" in result.output
    assert '"retry-policy"' in backup.read_text()
    found = await run("memory", "search", "svc payments timeout: gateway timeout is 30 seconds", "--limit", "1")
    assert found.exit_code == 0 and "svc/payments/timeout v1" in found.output, found.output
    for command in (["memory", "show"], ["memory", "export"]):  # and at the new width without an embedder
        assert (await run(*command)).exit_code == 0


# -- `memory import` of an export of another width: moving a store from SQLite to PostgreSQL, restoring a backup --

def sqlite_at(path: Path) -> StoreFactory:
    return lambda dimension=384: SQLiteStore(path)


async def wide_sqlite_export(path: Path) -> Any:
    """The export of a SQLite store that chat-mpnet's width (768) wrote: two versions of a key, a transcript turn
    whose sentences and context passage are kept beside its vector, an entry of another author."""
    service = await open_service(sqlite_at(path), WIDE)
    await service.write(ACTOR, WriteRequest("svc/payments", "retry-policy", "retry the card authorisation 3 times"))
    await service.write(ACTOR, WriteRequest("svc/payments", "retry-policy", "retry the card authorisation 5 times"))
    await service.write(Actor("agent/other", "s2"), WriteRequest("svc/payments", "timeout", "gateway timeout is 30 seconds"))
    await service.write(ACTOR, WriteRequest("chat/c1", "t1", "Jonah: Back from Kyoto! The bamboo forest was unreal."))
    await service.write(ACTOR, WriteRequest("chat/c1", "t2", "Felix: Jealous. Did you see the deer? Kyoto sounds lovely."))
    exported = await service.export_snapshot()
    await service.close()
    return exported


@pytest.mark.parametrize("store", ["postgres"], indirect=True)
async def test_an_export_of_another_width_imported_into_a_new_postgres_store_gives_it_that_width(
    make_store: StoreFactory, tmp_path: Path,
) -> None:
    exported = await wide_sqlite_export(tmp_path / "amfs.db")
    assert {len(e.embedding) for e in exported.entries} == {768} and any(e.passage_embeddings for e in exported.entries)
    importing = await open_service(make_store, None)  # as `amfs-server memory import` opens it: no embedder
    assert (await vector_column(importing.store))[0] == 384  # a new store, made without an embedder's width
    await importing.import_snapshot(exported)
    width, index = await vector_column(importing.store)
    assert width == 768 and index is not None and "hnsw" in index and "WHERE is_current" in index
    assert await importing.store.export_snapshot() == exported  # every version, vector and passage as it was
    await importing.close()

    service = await open_service(make_store, WIDE)  # a server with the export's embedder opens it
    hits = await service.retrieve(ACTOR, "gateway timeout is 30 seconds", limit=1)
    assert hits[0].entry.key == "timeout"
    hits = await service.retrieve(ACTOR, "Felix: Jealous. Did you see the deer? Kyoto sounds lovely.", limit=1)
    assert hits[0].entry.key == "t2"
    version = await service.write(ACTOR, WriteRequest("svc/payments", "retry-policy", "retry 7 times"))
    assert version.version == 3
    await service.close()


@pytest.mark.parametrize("store", ["postgres"], indirect=True)
async def test_an_import_of_another_width_the_store_cannot_take_is_refused_and_writes_nothing(
    make_store: StoreFactory, tmp_path: Path,
) -> None:
    from amfs_server.core.errors import ValidationError

    exported = await wide_sqlite_export(tmp_path / "amfs.db")
    narrow = MODEL_A.embed(["svc payments timeout: gateway timeout is 30 seconds"])[0].tolist()
    mixed = replace(exported, entries=[e.with_changes(embedding=narrow, passage_embeddings=None, context_key=None)
                                       if e.key == "timeout" else e for e in exported.entries])
    importing = await open_service(make_store, None)
    with pytest.raises(ValidationError, match=r"\[384, 768\] dimensions\. Nothing was imported"):
        await importing.import_snapshot(mixed)
    with pytest.raises(ValidationError, match=r"\[384, 768\] dimensions.*one width; nothing was imported"):
        await importing.store.import_snapshot(mixed)  # the store itself refuses it too
    assert await importing.store.export_snapshot() == replace(exported, entries=[], traces=[], meta={})
    assert (await vector_column(importing.store))[0] == 384
    await importing.close()

    configured = await open_service(make_store, MODEL_A)  # a process whose embedder has another width
    with pytest.raises(ValidationError, match=r"\[768\] dimensions; this store's embedder makes 384"):
        await configured.import_snapshot(exported)
    await configured.write(ACTOR, WriteRequest("svc/ledger", "currency", "charges are in EUR"))
    await configured.close()
    importing = await open_service(make_store, None)  # no embedder, but the store holds model-a's vectors now
    with pytest.raises(ValidationError, match=r"embedder='model-wide', this store's as 'model-a'.*amfs-server memory "
                                              r"reembed"):
        await importing.import_snapshot(exported)
    assert [e.key for e in (await importing.store.export_snapshot()).entries] == ["currency"]
    assert (await vector_column(importing.store))[0] == 384
    await importing.close()


@pytest.mark.parametrize("store", ["postgres"], indirect=True)
async def test_memory_import_command_moves_a_sqlite_store_of_the_default_embedders_width_to_a_new_postgres_store(
    store: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, default = bundled_stand_ins(monkeypatch)
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    await store_written_by(sqlite_at(data_dir / "amfs.db"), default)
    monkeypatch.setenv("AMFS_DATA_DIR", str(data_dir))
    monkeypatch.delenv("AMFS_POSTGRES_DSN", raising=False)
    export = tmp_path / "export.json"
    exported = await run("memory", "export", "--output", str(export))
    assert exported.exit_code == 0, exported.output

    use_postgres_store(store, monkeypatch)
    imported = await run("memory", "import", str(export))
    assert imported.exit_code == 0, imported.output
    assert "Imported 2 entry versions" in imported.output
    width, index = await vector_column(store)
    assert width == 768 and index is not None
    found = await run("memory", "search", "svc payments timeout: gateway timeout is 30 seconds", "--limit", "1")
    assert found.exit_code == 0 and "svc/payments/timeout v1" in found.output, found.output
