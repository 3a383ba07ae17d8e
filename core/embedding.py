"""Text embeddings for memory entries.

This module owns everything that turns text into vectors:

* :class:`Embedder` -- the protocol the rest of the server codes against
  (``name``, ``dimension``, ``embed(texts) -> float32 (n, dimension)`` with
  L2-normalised rows).
* :data:`DEFAULT_EMBEDDER` -- ``chat-mpnet-onnx-int8`` since 0.7.0: all-mpnet-base-v2 fine-tuned for
  conversational retrieval, as 8-bit ONNX on onnxruntime with a pure-Python WordPiece tokenizer
  (``adapters/onnx_embedder.py``, file bundled in ``adapters/models``); no torch.
* :data:`CHAT_MINILM` -- all-MiniLM-L6-v2 fine-tuned the same way, int8 (the default of 0.4.0-0.6.0, still
  bundled: five times faster a query, 384 dimensions).
* :data:`MINILM_INT8` -- all-MiniLM-L6-v2 itself the same way (the default up to 0.3.2).
* :data:`TORCH_MINILM` -- all-MiniLM-L6-v2 on transformers + torch (the ``[lm]``
  extra, ``adapters/torch_embedder.py``).
* :func:`embedding_text` -- the canonical text that represents one entry
  (entity path, key, value) for both embedding and keyword search.
* :func:`embed_in_batches` -- the batching loop both runtimes share.
* :class:`EmbedderUnavailableError` -- raised when the model or its runtime is
  not installed.  There is deliberately no fallback to fake/hashed vectors.

The runtimes and the process-wide factory (``load_embedder``) are adapters
(``adapters/embedders.py``); core only names them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from .errors import StoreError, install_extra
from .ports import Embedder
from .retrieval import speaker_label

__all__ = [
    "Embedder",
    "EmbedderUnavailableError",
    "DEFAULT_EMBEDDER",
    "CHAT_MINILM",
    "CHAT_MPNET",
    "MINILM_INT8",
    "RETIRED_EMBEDDERS",
    "EMBEDDER_META",
    "keep_or_reembed",
    "TORCH_MINILM",
    "MPNET",
    "GEMMA",
    "INSTALL_HINT",
    "ENTRY_VECTORS",
    "PASSAGE_SHARE",
    "TURN_HEADER",
    "embedding_header",
    "EntryVectors",
    "embed_entries",
    "entry_similarity",
    "embed_in_batches",
    "embed_queries",
    "Context",
    "context_passage",
    "context_passages",
    "EntryTexts",
    "entry_texts",
    "embedding_text",
    "event_date_words",
]

INSTALL_HINT = install_extra("lm", torch=True)

# all-MiniLM-L6-v2 fine-tuned to find the turn of a conversation that answers a question
# (scripts/finetune_embedder.py, on authored conversations only), int8 on onnxruntime, bundled, no torch.
CHAT_MINILM = "chat-MiniLM-L6-onnx-int8"
# all-mpnet-base-v2 fine-tuned by the same recipe (scripts/finetune_embedder.py --base mpnet), 768 dimensions,
# 8-bit weights on onnxruntime (MatMulNBits, block-wise 8-bit activations), bundled, no torch.
CHAT_MPNET = "chat-mpnet-onnx-int8"
# chat-mpnet's fast question side: seven of its twelve layers, the top ones retrained to put a question where
# chat-mpnet would (scripts/distill_query_encoder.py); it embeds questions only, never what is stored, so a store
# keeps CHAT_MPNET.
CHAT_MPNET_QUERY = "chat-mpnet-query-onnx-int8"
# chat-mpnet itself for questions, every MatMul on dynamic 8-bit kernels: faster on CPUs without VNNI
# (scripts/build_mixed_question_side.py); questions only, so a store keeps CHAT_MPNET.
CHAT_MPNET_MIXED = "chat-mpnet-mixed-onnx-int8"
# all-MiniLM-L6-v2 itself as int8 on onnxruntime: the default up to 0.3.2.
MINILM_INT8 = "all-MiniLM-L6-v2-onnx-int8"
# Embedders this release knows by name but no longer ships, and what to do about a store they wrote.
RETIRED_EMBEDDERS = {
    MINILM_INT8: ("was the default up to 0.3.2 and is no longer bundled (its successor, " + CHAT_MINILM + ", took "
                  "its place in the install). Re-embed the store with the default once: `amfs-server memory "
                  "reembed` (every version, a few ms each); nothing else changes"),
}
# The one definition of the default. Settings, the SDK, the CLI and the benchmarks import it from here.
DEFAULT_EMBEDDER = CHAT_MPNET
# The same model on torch + transformers (the [lm] extra). Its vectors differ from the int8 ones (cosine ~0.99),
# so a store keeps the embedder that wrote it (see MemoryService.open).
TORCH_MINILM = "all-MiniLM-L6-v2"
# all-mpnet-base-v2 on torch (the [mpnet] extra): better first-stage recall, several times the cost per text (README).
MPNET = "all-mpnet-base-v2"
# EmbeddingGemma-300M as int8 ONNX, fetched on request (`amfs-server embedder fetch embeddinggemma`, the [gemma]
# extra): the strongest first stage measured here, at about three times MiniLM's query cost (README).
GEMMA = "embeddinggemma-300m-onnx-int8"

# The store meta naming the embedder whose vectors the store holds (MemoryService; the PostgreSQL store reads it to
# name that embedder when its vector width is refused).
EMBEDDER_META = "embedder"


def keep_or_reembed(recorded: str | None, reembed: str = "every version, a few ms each") -> str:
    """The fix for a store whose vectors `recorded` made (None: not recorded) when another embedder is configured:
    re-embed it (`reembed` says what that does), or keep that embedder, unless it is no longer bundled."""
    if recorded in RETIRED_EMBEDDERS:  # keeping it is no option: its model is not installed any more
        return f"{recorded} {RETIRED_EMBEDDERS[recorded]}"
    if recorded is None:
        keep = "keep the embedder the store was made with"
    else:
        keep = f"keep the old embedder: AMFS_EMBEDDER={recorded}" + (
            f" (needs the [lm] extra: {INSTALL_HINT})" if recorded == TORCH_MINILM else "")
    return f"Either re-embed the store with the configured embedder: `amfs-server memory reembed` ({reembed}), or {keep}"


# Longest text embedding_text() produces. The model itself truncates at 256
# tokens (~1000-1500 characters of English); the extra room is for keyword search.
MAX_EMBEDDING_TEXT_CHARS = 2000


class EmbedderUnavailableError(StoreError):
    """The embedding model (or torch/transformers) is not installed or not loadable.

    A domain error, so MCP clients get its install hint as a tool error instead of an internal error.
    """


def embed_queries(embedder: Embedder, texts: Sequence[str]) -> np.ndarray:
    """Vectors for questions: the embedder's `embed_query` where it has one (a model trained with separate query
    and document prompts), else `embed`."""
    embed_query = getattr(embedder, "embed_query", None)
    return embed_query(texts) if embed_query is not None else embedder.embed(texts)


def embed_in_batches(
    texts: Sequence[str], dimension: int, batch_size: int, embed_batch: Callable[[list[str]], np.ndarray],
    load: Callable[[], object],
) -> np.ndarray:
    """`embed(texts)` for a runtime that embeds one padded batch at a time: checks the input (before loading
    the model, so bad input costs nothing), sorts longest first so each batch pads to similar lengths, and writes
    rows back to their source index."""
    if isinstance(texts, str):
        raise TypeError("embed() takes a sequence of strings, not a single string")
    texts = list(texts)
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise TypeError(f"texts[{i}] is {type(t).__name__}, expected str")
    out = np.empty((len(texts), dimension), dtype=np.float32)
    if not texts:
        return out
    load()
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]), reverse=True)
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        out[idx] = embed_batch([texts[i] for i in idx])
    return out


# --------------------------------------------------------------------------- #
# Entry text
# --------------------------------------------------------------------------- #

_SEPARATORS = re.compile(r"[-_/]+")
_WHITESPACE = re.compile(r"\s+")
_LEAD_FIELDS = ("summary", "text", "description")


_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December")


def _words(s: str) -> str:
    return _WHITESPACE.sub(" ", _SEPARATORS.sub(" ", s)).strip()


def _compact_json(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def _value_text(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, dict):
        for field in _LEAD_FIELDS:
            lead = value.get(field)
            if isinstance(lead, str) and lead.strip():
                rest = {k: v for k, v in value.items() if k != field}
                return f"{lead.strip()} {_compact_json(rest)}" if rest else lead.strip()
        return _compact_json(value)
    if isinstance(value, (list, tuple, bool, int, float)):
        return _compact_json(value)
    return str(value).strip()


def event_date_words(moment: datetime) -> str:
    """``2023-05-08T14:30Z`` -> ``"8 May 2023"`` (the UTC day, month in English words, as questions name dates)."""
    day = moment.astimezone(timezone.utc)
    return f"{day.day} {_MONTHS[day.month - 1]} {day.year}"


def embedding_text(entity_path: str, key: str, value: object, event_at: datetime | None = None) -> str:
    """The text representing one entry for embedding and keyword search.

    ``"svc/auth-service", "retry_policy", {"summary": "3 tries"}`` ->
    ``"svc auth service retry policy: 3 tries"``.  Deterministic (dict keys are
    sorted) and capped at :data:`MAX_EMBEDDING_TEXT_CHARS` characters.  With an
    `event_at`, the header names the event's date in words (``"... retry policy,
    8 May 2023: 3 tries"``), ahead of the value so the cap never cuts it, and a
    question naming that date or month can match it; without one the text is
    exactly what it always was.
    """
    header = _words(f"{entity_path} {key}")
    if event_at is not None:
        header = f"{header}, {event_date_words(event_at)}" if header else event_date_words(event_at)
    body = _value_text(value)
    text = f"{header}: {body}" if header and body else (header or body)
    if len(text) > MAX_EMBEDDING_TEXT_CHARS:
        text = text[:MAX_EMBEDDING_TEXT_CHARS].rstrip()
    return text


# --------------------------------------------------------------------------- #
# Entry vectors
# --------------------------------------------------------------------------- #

# How an entry's vectors are made from its text; recorded in the store's meta (ENTRY_VECTORS_META in service.py)
# so that a store whose vectors were made another way is re-embedded rather than mixed. Earlier schemes:
# "whole-entry" (one embedding of the whole text, no record), "sentence-mean" (the mean, no passage vectors),
# "sentence-mean+passages" (transcript turns embedded under their entity path and key, not TURN_HEADER) and
# "sentence-mean+passages+turn-header" (0.4.0: the vector of a several-sentence entry was its sentences' mean alone).
ENTRY_VECTORS = "whole+sentence-mean+passages+turn-header"
# A transcript turn ("Caroline: ...") whose key carries a number (a turn id: "s25-t11", "D1:3", a UUID) is embedded
# under this fixed header instead of its entity path and key: ids are not what was said, yet as words in every
# sentence they moved its vectors (on the tuning split, replacing them by a fixed header moved single conversations
# by -0.033 to +0.060 recall@10; docs/retrieval-record.md). A labelled note keyed by words ("Deploys: ..." under "deploy-process")
# keeps its header, which names its topic. Chosen among eight fixed headers on the conversation set's tuning split;
# keyword search still sees the path and key.
TURN_HEADER = "chat message"
_NUMBER = re.compile(r"\d")
# An entry's semantic score: this share from its best passage's cosine to the query, the rest from its mean
# vector's (ServiceConfig.passage_share). Chosen on the conversation set's tuning split with
# `python -m amfs_server.session_bench.tune_fusion --passage-shares ...` (docs/retrieval-record.md).
PASSAGE_SHARE = 0.5
MAX_PASSAGES = 16
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


# A passage that asks something (its text ends with "?") counts this much less in the best-passage look
# (`entry_similarity`): a question in a turn is seldom what answers one, and a red-team "hub" (about 180 words of
# questions people ask, taken from other conversations with the speakers' names swapped in) matched each question
# through its most similar question. Chosen on the annotated conversations' tuning split and the agent-memory set's
# even half, where it changes neither's figures, against the red team's recipe on the tuning conversations
# (`python scripts/poisoning_bench.py --target ann-01`; docs/retrieval-record.md, 0.7.12). Hubs written as
# statements are not discounted.
QUESTION_PASSAGE_DISCOUNT = 0.1


def sentence_runs(value: str) -> list[str]:
    """A text value's sentences, grouped into at most MAX_PASSAGES runs when there are more: `entry_texts`'
    passages before their headers."""
    sentences = [s for s in (part.strip() for part in _SENTENCE_END.split(value.strip())) if s]
    if len(sentences) > MAX_PASSAGES:
        size = -(-len(sentences) // MAX_PASSAGES)
        sentences = [" ".join(sentences[i:i + size]) for i in range(0, len(sentences), size)]
    return sentences


def passage_questions(value: object, rows: int) -> np.ndarray:
    """Per row of an entry's passage embeddings (`EntryVectors.passages`, as the store returns them), whether that
    passage asks something: its sentence runs in order (the whole value for a one-sentence entry), then its
    context passage, which asks when the entry's own last run does. A value read by its head (not a string) asks
    nothing."""
    flags = np.zeros(rows, dtype=bool)
    if not isinstance(value, str) or rows == 0:
        return flags
    runs = sentence_runs(value)
    asked = [run.endswith("?") for run in (runs if len(runs) >= 2 else [value.strip()])]
    for i in range(rows):
        flags[i] = asked[min(i, len(asked) - 1)]
    return flags


def embedding_header(entity_path: str, key: str, label: str | None) -> tuple[str, str]:
    """The (path, key) an entry's embedded texts are headed with, given its speaker `label` (`speaker_label`):
    (TURN_HEADER, "") for a transcript turn keyed by a turn id (its key carries a number), else its own."""
    if label is not None and _NUMBER.search(key):
        return TURN_HEADER, ""
    return entity_path, key


class EntryTexts(NamedTuple):
    """The texts an entry's vectors are made of (`entry_texts`)."""

    whole: str  # the entry's whole text under its header (`embedding_text`)
    sentences: list[str]  # one per sentence when the value has two or more, each under the header; else empty


def entry_texts(entity_path: str, key: str, value: object, event_at: datetime | None = None) -> EntryTexts:
    """The whole text of an entry and, for a text value of two or more sentences, one text per sentence, all with
    the entry's header (`embedding_header`: a turn's fixed one, else its path and key) and each sentence with a
    transcript turn's speaker (`"Caroline: ..."`).

    The sentences' embeddings keep each sentence's topic, which a mean-pooled embedding of a long, many-topic turn
    ("Ugh, Mondays. Meet Taco, my new Maine Coon kitten.") dilutes (on the conversation set's tuning split: semantic
    recall@10 0.542 -> 0.635 with 0.3.x's model, docs/retrieval-record.md); the whole text is what the chat embedder was fine-tuned
    on. Longer texts are grouped into at most MAX_PASSAGES runs of sentences, so a write embeds a bounded number.
    """
    label = speaker_label(value)
    entity_path, key = embedding_header(entity_path, key, label)
    whole = embedding_text(entity_path, key, value, event_at)
    if not isinstance(value, str):
        return EntryTexts(whole, [])
    sentences = sentence_runs(value)
    if len(sentences) < 2:
        return EntryTexts(whole, [])
    prefix = f"{label}: " if label else ""
    return EntryTexts(whole, [embedding_text(entity_path, key, s if i == 0 else prefix + s, event_at)
                              for i, s in enumerate(sentences)])


@dataclass(frozen=True)
class EntryVectors:
    """What `embed_entries` makes: per entry, its unit vector (row of `vectors`) and the unit embeddings its
    best-sentence look scores (`passages[i]`, shape (rows, dimension)): its passages' when two or more, then its
    context passage's when it has one; None for a single passage without context, whose embedding is the entry
    vector itself."""

    vectors: np.ndarray
    passages: list[np.ndarray | None]


def context_passage(entity_path: str, key: str, previous: object, value: object,
                    event_at: datetime | None = None) -> str | None:
    """A transcript turn's context passage: the turn written just before it under the same entity path, then the
    turn itself, as one text (`"Jonah: We're thinking of a skydive! Felix: Count me out, I get dizzy."`), when both
    are transcript turns (`"Name: ..."`); else None.

    A reply often names its topic only in the turn it answers; this passage lets the best-sentence look find it
    ("Why won't Felix skydive?"). It joins the entry's passages, never its vector (docs/retrieval-record.md)."""
    if not (isinstance(previous, str) and isinstance(value, str)):
        return None
    label = speaker_label(value)
    if speaker_label(previous) is None or label is None:
        return None
    return embedding_text(*embedding_header(entity_path, key, label), f"{previous.strip()} {value.strip()}", event_at)


# A context passage's text and the key whose turn lent it, or None.
Context = tuple[str, str] | None


def context_passages(
    entries: Sequence[tuple[str, str, Any, datetime | None]], order: Sequence[int],
    before: Mapping[str, Sequence[tuple[str, Any, bool]]] | None = None, expiring: Sequence[bool] | None = None,
) -> list[Context]:
    """Each (entity_path, key, value, event_at)'s context passage, the entries taken in write `order`: with the
    entry written just before it under the same path (another key), among these or, for the first ones of a path,
    in `before[path]` ((key, value, expiring) of what the store held there, oldest first). Writes and `reembed` both
    call this, so they make the same passages while the store holds the same memories (after an entry with a TTL
    expired, `reembed` gives the turn after it the passage of the one before). An entry with a TTL (`expiring`) lends
    none: the turn after it takes no passage, since the expired turn's words would keep ranking it until the expiry sweep erased them (red-team
    finding, 0.7.15; a forget strips the passage at once)."""
    written: dict[str, list[tuple[str, Any, bool]]] = {path: list(held) for path, held in (before or {}).items()}
    contexts: list[Context] = [None] * len(entries)
    for i in order:
        entity_path, key, value, event_at = entries[i]
        earlier = written.setdefault(entity_path, [])
        previous = next(((k, v, e) for k, v, e in reversed(earlier) if k != key), None)
        if previous is not None and not previous[2]:
            text = context_passage(entity_path, key, previous[1], value, event_at)
            contexts[i] = None if text is None else (text, previous[0])
        earlier.append((key, value, bool(expiring[i]) if expiring is not None else False))
    return contexts


def _unit(vector: np.ndarray) -> np.ndarray:
    norm = float(np.linalg.norm(vector))
    return vector / norm if norm > 0 else vector


def embed_entries(embed: Callable[[list[str]], np.ndarray], texts: Sequence[EntryTexts],
                  contexts: Sequence[str | None] | None = None) -> EntryVectors:
    """Each entry's vector and the embeddings its best-sentence look scores, in one `embed` call.

    An entry of one sentence (or a structured value): its whole text's embedding is the vector. Of two or more:
    the normalised sum of the whole text's embedding and the normalised mean of its sentences' (on both
    conversation sets' tuning splits the sum beat the mean alone, by recall@10 and MRR, with the fine-tuned chat
    embedder, which learned on whole turns; docs/retrieval-record.md), and its sentences' embeddings are kept for the look. A context
    passage (`contexts[i]`) joins the look's embeddings, never the vector; then a one-sentence entry keeps its own
    embedding there too."""
    contexts = list(contexts) if contexts is not None else [None] * len(texts)
    flat = [text for entry in texts for text in (entry.whole, *entry.sentences)]
    flat += [text for text in contexts if text is not None]
    embedded = embed(flat)
    out = np.zeros((len(texts), embedded.shape[1]), dtype=np.float32)
    kept: list[np.ndarray | None] = []
    start = 0
    extra = sum(1 + len(entry.sentences) for entry in texts)
    for i, entry in enumerate(texts):
        whole = embedded[start]
        rows = embedded[start + 1:start + 1 + len(entry.sentences)] if entry.sentences else embedded[start:start + 1]
        start += 1 + len(entry.sentences)
        out[i] = _unit(whole + _unit(rows.mean(axis=0))) if entry.sentences else whole
        if contexts[i] is not None:
            rows = np.vstack([rows, embedded[extra:extra + 1]])
            extra += 1
        kept.append(np.array(rows, dtype=np.float32) if len(rows) > 1 else None)
    return EntryVectors(out, kept)


def entry_similarity(vector_cosine: float, passages: np.ndarray | None, query: np.ndarray,
                     share: float = PASSAGE_SHARE, questions: np.ndarray | None = None) -> float:
    """An entry's semantic score for a unit `query` vector, given its vector's cosine to the query and its passage
    embeddings: the mean vector keeps the whole entry's topic, the best passage finds the one sentence a question
    asks about in a many-topic turn ("Meet Taco, my new Maine Coon kitten" among small talk). `share` is the best
    passage's part (0: the mean vector alone). `questions` (`passage_questions`) marks the passages that ask
    something: each counts QUESTION_PASSAGE_DISCOUNT less."""
    if passages is None or len(passages) == 0 or share == 0.0:
        return vector_cosine
    cosines = passages @ query
    if questions is not None:
        cosines = cosines - QUESTION_PASSAGE_DISCOUNT * questions
    best = float(cosines.max())
    return (1.0 - share) * vector_cosine + share * best
