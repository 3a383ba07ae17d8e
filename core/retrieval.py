"""Hybrid retrieval: strategies that rank candidates, and the fusions that combine them.

semantic and keyword search the store for the query; temporal (recency of the event, else of the write, to the hour),
confidence (effective confidence after decay) and, once a ranker is trained, learned, order that
same candidate pool: on their own they know nothing about the query. speaker marks the relevant candidates
attributed to someone the question names (a transcript turn "Caroline: ..."; see `speaker_matches`). Two fusions:

* `hybrid` (the default): a weighted sum of scores on a common 0..1 scale. Keyword scores already are one (the
  share of the query's word weight an entry matches, capped at 1: see `MemoryStore.keyword_candidates`), so a
  keyword hit counts by how much of the question it covers: an entry naming the rare word asked about scores high,
  one sharing only a common word stays low even when it is the best keyword hit there is. The other strategies
  are min-max normalised over their own pool (best score 1, the `pool`-th best and below 0). Semantic and keyword
  share the relevance weight; the query-blind strategies get small weights, so they break near-ties between
  relevant entries and cannot outvote a clear relevance gap.
* `rrf` (the seed's design, kept as a named configuration): weighted Reciprocal Rank Fusion,
  `score = sum_s w_s / (k + rank_s)` with 1-based ranks, weights 0.4/0.2/0.2/0.2.
"""

from __future__ import annotations

import functools
import math
import re
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .errors import ValidationError
from .models import MemoryEntry, ValueHead

STRATEGIES: tuple[str, ...] = ("semantic", "keyword", "temporal", "confidence", "speaker", "learned")
QUERY_BLIND: frozenset[str] = frozenset({"temporal", "confidence", "learned"})
FUSIONS: tuple[str, ...] = ("hybrid", "rrf")
RRF_WEIGHTS: dict[str, float] = {"semantic": 0.4, "keyword": 0.2, "temporal": 0.2, "confidence": 0.2, "speaker": 0.0,
                                 "learned": 0.0}
# semantic/keyword 0.5/0.5 since 0.4.0's chat embedder (0.3/0.7 before): chosen on the tuning splits of both
# conversation sets (the authored one cross-fitted, the generated one clean and with 10% of evidence re-attributed);
# docs/retrieval-record.md has every half.
# speaker is off by default: it pays only while nearly every evidence turn is the named person's own (docs/retrieval-record.md);
# SPEAKER_WEIGHT is what it was tuned to, for transcript stores where that holds: weights={"speaker": SPEAKER_WEIGHT}.
HYBRID_WEIGHTS: dict[str, float] = {"semantic": 0.5, "keyword": 0.5, "temporal": 0.05, "confidence": 0.05, "speaker": 0.0,
                                    "learned": 0.0}
SPEAKER_WEIGHT = 0.1
# A question naming an identifier (ERR_LEDGER_409, retryPolicy, payments.gateway, INC-3, v2, /api/pay) is one keyword
# search answers best; semantic / keyword go back to 0.3.2's 0.3 / 0.7 share for it when the call and the config leave
# those two weights at their defaults. No question of either conversation set matches; on the agent-memory set
# 69 of its 72 identifier questions and 39 of 42 mixed ones do (docs/retrieval-record.md).
IDENTIFIER_SEMANTIC_SHARE = 0.3
_IDENTIFIER = re.compile(r"\b\w+_\w+\b|\b[a-z]+[A-Z]\w*\b|\b[A-Za-z]\w*\.[A-Za-z]\w*\b|\b[A-Z]{2,}-?\d+\b"
                         r"|\b[A-Za-z]+\d+[A-Za-z\d]*\b|(?<![\w/])/[\w/-]+")
# Strategies whose scores are already on the fusion's 0..1 scale (capped at 1 rather than min-max normalised).
ABSOLUTE_SCORES: frozenset[str] = frozenset({"keyword", "speaker"})
DEFAULT_WEIGHTS = HYBRID_WEIGHTS
# An embedder whose semantic search alone is strong enough to earn more of the weight than the default half; chosen
# for it on the conversation sets' tuning splits (docs/retrieval-record.md, "EmbeddingGemma-300M, opt-in").
EMBEDDER_SEMANTIC_SHARE: dict[str, float] = {"embeddinggemma-300m-onnx-int8": 0.8}
LEARNED_WEIGHT = 0.3
HYBRID_POOL = 50
MIN_RANGE: dict[str, float] = {"confidence": 1.0, "temporal": 30 * 86400.0}
"""Per query-blind strategy, the least spread its min-max normalisation divides by (`normalised`): a confidence of
1.5 among entries at 1.0 gets half the confidence share, not all of it, and an entry an hour newer than the rest
1/720 of the temporal share. Where every candidate tied but one, that one took the whole 0.05 of each: a red-team
pass's poisoned copies of evidence turns, written later with confidence 1.5, ranked first for 37 of 60 questions
(15 without the two; 0.7.11). Chosen on the agent-memory set's tuning half by a rule written first (the largest
ranges within 0.005 of none); the held-out half's cost is in the README."""
DEFAULT_RRF_K = 60
MAX_QUERY_TERMS = 32
LATE_IDENTIFIER_TERMS = 8  # of those, the places kept for identifiers past the first 24 terms

_STOPWORDS = frozenset(
    """a an and are as at be been but by can could did do does for from had has have how i if in into is it its
    me my of on or our should so than that the their them then there these they this to was we were what when
    where which who whom why will with would you your about after again all also any because before being
    between both each few more most other over same some such only own just very now""".split()
)
_ALNUM = re.compile(r"[^\W_]+")


def _code_point_ranges(category_prefix: str, *spans: range) -> list[tuple[int, int]]:
    """The runs of code points in `spans` whose Unicode category starts with `category_prefix`."""
    ranges: list[list[int]] = []
    for span in spans:
        for cp in span:
            if unicodedata.category(chr(cp)).startswith(category_prefix):
                if ranges and ranges[-1][1] == cp - 1:
                    ranges[-1][1] = cp
                else:
                    ranges.append([cp, cp])
    return [(a, b) for a, b in ranges]


@functools.cache
def _combining_marks() -> str:
    """The combining marks (Unicode categories Mn, Mc, Me) as a regex class body, built once on first use (60 ms)."""
    return "".join(f"\\U{a:08x}-\\U{b:08x}" for a, b in _code_point_ranges("M", range(0x300, 0x20000),
                                                                          range(0xE0100, 0xE01F0)))


@functools.cache
def query_word_pattern() -> re.Pattern[str]:
    """A word of a keyword query: a word character, then word characters and combining marks (marks alone make no
    word). Python's `\\w` leaves out the vowel signs and viramas of Indic scripts and Arabic's vowel marks, so
    `\\w+` cut "हिन्दी" into one-letter pieces that matched nothing on either store; whole, the word is matched as each store's index split it (SQLite searches it
    as a phrase of its FTS5 tokens, PostgreSQL's parser keeps it whole on both sides)."""
    return re.compile(f"\\w[\\w{_combining_marks()}]*")


@functools.cache
def query_word_part_pattern() -> re.Pattern[str]:
    """`query_word_pattern` less the underscore: the parts PostgreSQL's parser splits an identifier into."""
    return re.compile(f"[^\\W_](?:[^\\W_]|[{_combining_marks()}])*")


def search_form(text: str) -> str:
    """Text as keyword search indexes and queries it: Unicode NFC ("Cafe\u0301" and "Caf\u00e9" are one word)."""
    return unicodedata.normalize("NFC", text)


@functools.cache
def _invisible() -> re.Pattern[str]:
    """Format characters (category Cf: zero-width spaces and joiners, soft hyphens, direction marks, tags); built once,
    on first use."""
    found = _code_point_ranges("Cf", range(0x20000), range(0xE0000, 0xE0080))
    return re.compile("[" + "".join(f"\\U{a:08x}-\\U{b:08x}" for a, b in found) + "]+")


_SPACES = re.compile(r"\s+")


def visible_text(text: str) -> str:
    """What a reader sees of `text`, to tell copies apart: NFC, without format characters, white space runs made one
    space, trimmed. A zero-width space in every word hid a fake copy from `near_copies` (and a trailing one kept a copy
    out of `without_copies`' merge) while it read the same (red-team finding, 0.7.15)."""
    if not text.isascii():
        text = _invisible().sub("", search_form(text))
    return _SPACES.sub(" ", text).strip()


@functools.cache
def _between_words() -> re.Pattern[str]:
    return re.compile(f"[^\\w\\s{_combining_marks()}]+")


def words_apart(text: str) -> str:
    """`text` with every run of characters that are neither word characters, combining marks nor spaces made one
    space: the words a query is split into (`query_word_pattern`), and nothing joining them. PostgreSQL's parser
    otherwise indexes `v2.3.1`, `src/app/main.py`, `bob@example.com`, `15.4`, URLs and `-20` as single tokens that no
    query's words match (SQLite's FTS5 splits at all of these by itself)."""
    return _between_words().sub(" ", text)


# An entry with more distinct words (stop words aside) than this holds more of any question's words by its length
# alone: a pasted dump, or a memory stuffed with common question words to surface for every query (one of 1,500
# such words among a conversation's turns ranked first for half its questions). Above it the keyword score shrinks
# with the square of the excess. 80 is above the longest entry of both data sets (turns up to 46 distinct words,
# agent memories 51), so neither set's ranking moves; 40 held stuffing back further but cost the agent-memory set's
# tuning half 0.010 MRR (docs/retrieval-record.md: Long and stuffed memories).
KEYWORD_LENGTH_PIVOT = 80


def distinct_words(search_text: str) -> int:
    """The distinct words of a search text (stop words aside) as the length factor counts them. The stores count
    them once, when they write the text (`distinct_words` column): counting at read cost up to 0.85 s of CPU for a
    filtered retrieval that widened its keyword search to 12,800 rows."""
    # Split wherever either store's index splits words: at underscores (PostgreSQL's parser) and at the characters
    # `_index_word_breaks` names, so words joined by them cannot count as one while each stays searchable.
    text = search_form(search_text).lower().translate(_index_word_breaks())
    return len({word for word in _ALNUM.findall(text) if word not in _STOPWORDS})


def keyword_length_factor(words: int) -> float:
    """1 for an entry of up to KEYWORD_LENGTH_PIVOT distinct words (`distinct_words`), (pivot / n)^2 for one of n more."""
    return min(1.0, (KEYWORD_LENGTH_PIVOT / words) ** 2) if words else 1.0


# SQLite FTS5's unicode61 tables (Unicode 6.1) take these for separators; Python's (newer) tables for letters.
_FTS5_SEPARATING_LETTERS = (*range(0x19B0, 0x19C1), 0x19C8, 0x19C9, 0x1CF2, 0x1CF3)


@functools.cache
def _index_word_breaks() -> dict[int, str]:
    """Characters Python's `\\w` counts as part of a word but a store's index splits words at, each mapped to a
    space: other numbers (category No: '²', '½'), where PostgreSQL's parser splits, and the letters FTS5 does not
    know. Joined by '²', 300 common question words counted as one word, escaped the length factor and reached the
    top 10 for 45 of a conversation's 168 questions (red-team finding, 0.7.10). Built once, on first use (30 ms);
    no character above U+2FFFF is of category No. `test_every_character_*_splits_words_at_breaks_them_for_the_length_factor`
    (tests/adapters, per store) checks the list against both stores' own tokenisers."""
    breaks = {cp: " " for cp in range(0x80, 0x30000) if unicodedata.category(chr(cp)) == "No"}
    breaks.update({cp: " " for cp in _FTS5_SEPARATING_LETTERS})
    return breaks


def keyword_terms(query: str) -> list[str]:
    """The words of a natural-language query worth matching: lower-cased, no stop words, deduplicated. In Unicode
    NFC, as stored search text is (`search_form`): a decomposed accent is not a word character and would split
    the word."""
    terms: list[str] = []
    for word in query_word_pattern().findall(search_form(query).lower()):
        if word not in _STOPWORDS and word not in terms and (len(word) > 1 or word.isdigit()):
            terms.append(word)
    if len(terms) > MAX_QUERY_TERMS:
        # A long question is searched by its first words and, in the last LATE_IDENTIFIER_TERMS places, by the
        # identifier-like words (digits or underscores: ERR_LEDGER_422, 8080) that come after them: an error code
        # after 43 words of context was cut off (red-team repro). Order is kept; slots no identifier takes go to the
        # next words. No question of the benchmarks has more than 14 terms.
        head = terms[:MAX_QUERY_TERMS - LATE_IDENTIFIER_TERMS]
        late = [t for t in terms[len(head):] if any(c.isdigit() or c == "_" for c in t)][:LATE_IDENTIFIER_TERMS]
        fill = [t for t in terms[len(head):] if t not in late][:MAX_QUERY_TERMS - len(head) - len(late)]
        kept = set(head) | set(late) | set(fill)
        terms = [t for t in terms if t in kept]
    return terms


# A memory attributed to someone: a value that opens with a name and a colon, as a transcript turn does
# ("Caroline: I went to ..."). One or two capitalised words, so prose with a colon later on does not count; any
# script's capitals ("Émile", "Ömer Faruk": only ASCII ones counted until 0.7.14, so such turns had no header or
# context passage), read in NFC so a decomposed accent ("Zoe\u0308") is part of its word.
_SPEAKER_LABEL = re.compile(r"^\s*([^\W\d_][\w'.-]{0,29}(?: [^\W\d_][\w'.-]{0,29})?):\s")


def speaker_label(value: Any) -> str | None:
    """The name a memory's text is attributed to (`"Caroline: I went ..."` -> `"Caroline"`), or None."""
    if isinstance(value, ValueHead) and value.json_head.startswith('"'):
        value = value.text_head()  # a long string read by its head (a retrieval's candidates): the label opens it
    if not isinstance(value, str):
        return None
    match = _SPEAKER_LABEL.match(search_form(value[:200]))
    if match is None or not all(word[0].isupper() for word in match.group(1).split(" ")):
        return None
    return match.group(1)


def speaker_matches(query: str, entries: Sequence[MemoryEntry]) -> list[tuple[str, float]]:
    """The speaker strategy: entries attributed to someone the question names score 1 (the others are not listed).

    A question about a person ("What did Caroline research?") is most often answered by what that person said;
    the keyword strategy barely sees the name, since a speaker's name is on half of a conversation's turns. A
    two-word label ("Amara Nwosu") is named by its first word alone too: people ask about "Amara"."""
    asked = set(query_word_pattern().findall(search_form(query).lower()))
    matched = []
    for entry in entries:
        label = speaker_label(entry.value)
        words = query_word_pattern().findall(label.lower()) if label is not None else []
        given = words[0] if len(words) > 1 and words[0] not in _STOPWORDS else None  # "The Bot" is not "the"
        if words and (given in asked or all(word in asked for word in words)):
            matched.append((entry.entry_key, 1.0))
    return matched


RECENCY_RESOLUTION_S = 3600


def recency_bucket(written_at: datetime) -> float:
    """The temporal strategy's score: when the event happened (`MemoryEntry.event_time`: its event_at, else
    when the version was written), to the hour (as a POSIX timestamp).

    Entries written within the same clock hour tie (they share a rank): seconds apart within one session
    say nothing about which is more relevant, and ranking them strictly let recency reorder facts a
    conversation wrote one after another.
    """
    return written_at.timestamp() // RECENCY_RESOLUTION_S * RECENCY_RESOLUTION_S


def resolve_weights(
    overrides: Mapping[str, float] | None, learned_available: bool, fusion: str = "hybrid", query: str | None = None,
    embedder: str | None = None,
) -> dict[str, float]:
    """Default or configured weights; a trained ranker takes 30% and the others share the remaining 70%. Hybrid
    fusion's default semantic / keyword share is the `embedder`'s in EMBEDDER_SEMANTIC_SHARE where it has one, and
    IDENTIFIER_SEMANTIC_SHARE for a `query` that names an identifier (neither when `overrides` sets either)."""
    weights = dict(HYBRID_WEIGHTS if fusion == "hybrid" else RRF_WEIGHTS)
    if fusion == "hybrid" and not {"semantic", "keyword"} & set(overrides or {}):
        share = EMBEDDER_SEMANTIC_SHARE.get(embedder or "")
        if query is not None and names_an_identifier(query):
            share = IDENTIFIER_SEMANTIC_SHARE
        if share is not None:
            relevance = weights["semantic"] + weights["keyword"]
            weights["semantic"] = relevance * share
            weights["keyword"] = relevance * (1.0 - share)
    for name, weight in (overrides or {}).items():
        if name not in STRATEGIES:
            raise ValidationError(f"Unknown retrieval strategy {name!r}; use one of {list(STRATEGIES)}.")
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) or weight < 0:
            raise ValidationError(f"Weight for {name} must be a finite number >= 0, got {weight!r}.")
        weights[name] = float(weight)
    if learned_available and weights["learned"] == 0.0 and not (overrides and "learned" in overrides):
        base = {name: w for name, w in weights.items() if name != "learned"}
        total = sum(base.values()) or 1.0
        weights = {name: w / total * (1.0 - LEARNED_WEIGHT) for name, w in base.items()}
        weights["learned"] = LEARNED_WEIGHT
    elif not learned_available:
        weights["learned"] = 0.0
    return weights


def names_an_identifier(query: str) -> bool:
    """Whether `query` holds a token shaped like an identifier rather than a word (see IDENTIFIER_SEMANTIC_SHARE)."""
    return _IDENTIFIER.search(query) is not None


@dataclass(frozen=True)
class StrategyHit:
    rank: int
    raw_score: float
    contribution: float

    def to_dict(self) -> dict[str, float | int]:
        return {"rank": self.rank, "raw_score": round(self.raw_score, 6), "contribution": round(self.contribution, 6)}


@dataclass(frozen=True)
class RetrievedEntry:
    entry: MemoryEntry
    score: float
    rank: int
    strategies: dict[str, StrategyHit] | None = None
    near_copies: tuple[str, ...] = ()
    """Entry keys of other results of the same retrieve whose text nearly repeats this one's (`near_copies`)."""

    def to_dict(self, include_embedding: bool = False) -> dict[str, Any]:
        data: dict[str, Any] = {
            "rank": self.rank,
            "score": round(self.score, 6),
            "entry": self.entry.to_dict(include_embedding=include_embedding),
        }
        if self.strategies is not None:
            data["explain"] = {name: hit.to_dict() for name, hit in self.strategies.items()}
        if self.near_copies:
            data["near_copies"] = list(self.near_copies)
        return data


NEAR_COPY_SHARE = 0.6
"""Word-set overlap (Jaccard) from which two results count as near copies of each other."""
NEAR_COPY_MIN_WORDS = 5
NEAR_COPY_MAX_CHARS = 4000
"""Longer values are not compared (a note, not a message; and it keeps the check cheap)."""


def near_copies(values: Sequence[Any]) -> list[list[int]]:
    """For each value, the indexes of the others that nearly repeat it: two different strings of at least
    NEAR_COPY_MIN_WORDS distinct words sharing NEAR_COPY_SHARE of their words. A red-team pass copied evidence turns
    with one fact changed; the fake ranked above the real turn for 23 of 60 questions and both came back with nothing
    to tell them apart (0.7.11). Ranking does not change; the results say which ones to check against each other.
    The share was set on the annotated conversations (all eight) and the red team's way of changing a fact: 0.6 marks
    79% of 2,338 such fakes and 6 of 341,382 genuine pairs of turns of one conversation."""
    words: list[frozenset[str] | None] = []
    seen: list[str | None] = []
    for value in values:
        if isinstance(value, str) and len(value) <= NEAR_COPY_MAX_CHARS:
            text = visible_text(value)
            seen.append(text)
            found = frozenset(_ALNUM.findall(text.casefold()))
            words.append(found if len(found) >= NEAR_COPY_MIN_WORDS else None)
        else:
            seen.append(None)
            words.append(None)
    pairs: list[list[int]] = [[] for _ in values]
    for i, a in enumerate(words):
        for j in range(i + 1, len(words)):
            b = words[j]
            if a is None or b is None or seen[i] == seen[j]:
                continue
            if len(a & b) >= NEAR_COPY_SHARE * len(a | b):
                pairs[i].append(j)
                pairs[j].append(i)
    return pairs


@dataclass
class RankedList:
    """One strategy's ranking of candidate entry keys, best first, with its raw scores."""

    strategy: str
    keys: list[str] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)

    @classmethod
    def from_scored(cls, strategy: str, scored: Sequence[tuple[str, float]]) -> RankedList:
        ordered = sorted(scored, key=lambda item: item[1], reverse=True)
        return cls(strategy, [key for key, _ in ordered], [score for _, score in ordered])


def _combine(
    rankings: Sequence[RankedList], contribution_of: Callable[[RankedList], Callable[[str, int], float]]
) -> list[tuple[str, float, dict[str, StrategyHit]]]:
    """Sum per-strategy contributions: (entry_key, fused score, per-strategy hits) best first, ties in first-seen
    order. `contribution_of(ranking)(key, rank)` scores one entry of one ranking."""
    fused: dict[str, float] = {}
    hits: dict[str, dict[str, StrategyHit]] = {}
    for ranking in rankings:
        contribution = contribution_of(ranking)
        position = 0
        for index, (key, raw) in enumerate(zip(ranking.keys, ranking.scores), start=1):
            # Equal raw scores share a rank, so ties (e.g. every confidence at 1.0) carry no order of their own.
            if index == 1 or raw != ranking.scores[index - 2]:
                position = index
            part = contribution(key, position)
            fused[key] = fused.get(key, 0.0) + part
            hits.setdefault(key, {})[ranking.strategy] = StrategyHit(position, raw, part)
    order = sorted(fused, key=lambda key: fused[key], reverse=True)
    return [(key, fused[key], hits[key]) for key in order]


def fuse(
    rankings: Sequence[RankedList], weights: Mapping[str, float], k: int = DEFAULT_RRF_K
) -> list[tuple[str, float, dict[str, StrategyHit]]]:
    """Weighted RRF: each strategy adds `weight / (k + rank)`."""

    def contribution_of(ranking: RankedList) -> Callable[[str, int], float]:
        weight = weights.get(ranking.strategy, 0.0)
        return lambda _key, position: weight / (k + position)

    return _combine(rankings, contribution_of)


def normalised(ranking: RankedList, pool: int = HYBRID_POOL, min_range: float = 0.0) -> dict[str, float]:
    """Min-max over the ranking's own scale: its best score is 1, its `pool`-th best (and below) 0; with
    `min_range`, divided by at least that spread, so a best score only slightly above the rest stays near 0.

    Ties all at one value (every confidence 1.0, every turn in one hour) carry no order: all 0.
    """
    if not ranking.scores:
        return {}
    high = ranking.scores[0]
    low = ranking.scores[min(pool, len(ranking.scores)) - 1]
    if high <= low:
        return {key: 0.0 for key in ranking.keys}
    spread = max(high - low, min_range)
    return {key: max(0.0, (raw - low) / spread) for key, raw in zip(ranking.keys, ranking.scores)}


def fuse_hybrid(
    rankings: Sequence[RankedList], weights: Mapping[str, float], pool: int = HYBRID_POOL
) -> list[tuple[str, float, dict[str, StrategyHit]]]:
    """Weighted sum of scores on a 0..1 scale: ABSOLUTE_SCORES capped, the others min-max normalised over `pool`
    (see the module docstring). Same shape as `fuse`."""

    def contribution_of(ranking: RankedList) -> Callable[[str, int], float]:
        weight = weights.get(ranking.strategy, 0.0)
        if ranking.strategy in ABSOLUTE_SCORES:
            scaled = {key: min(1.0, max(0.0, raw)) for key, raw in zip(ranking.keys, ranking.scores)}
        else:
            scaled = normalised(ranking, pool, MIN_RANGE.get(ranking.strategy, 0.0))
        return lambda key, _position: weight * scaled[key]

    return _combine(rankings, contribution_of)


LearnedScorer = Callable[[list[MemoryEntry], dict[str, dict[str, int]], "str | None"], list[float]]
"""Scores candidates (higher = more useful) given each entry's per-strategy ranks and the retrieval's entity_path
filter (None: the whole store); set by the ML layer."""
