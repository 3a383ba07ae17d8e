"""A pure-Python BERT WordPiece tokenizer: the embedder's tokenisation without ``tokenizers``.

:class:`WordPieceTokenizer` reads a BERT ``tokenizer.json`` (BertNormalizer, BertPreTokenizer, WordPiece,
a ``[CLS] $A [SEP]``-style TemplateProcessing, or MPNet's ``<s> $A </s>`` RobertaProcessing) and gives, id for
id, what ``tokenizers`` gives for one text with ``enable_truncation(max_length)`` and no padding.  It exists so that the default install need not pull
``tokenizers`` + ``huggingface_hub`` + ``hf_xet`` + ``fsspec`` (about 33 MB) to tokenise short texts; a
``tokenizer.json`` of another shape is refused rather than tokenised differently.

Where ``tokenizers`` departs from a textbook BERT tokeniser, this follows ``tokenizers``:

* Special tokens (``[CLS]``, ``[SEP]``, ``[PAD]``, ...) written in the text are split off before any
  normalisation and become their own ids (``"a[SEP]b"`` -> ``a``, ``[SEP]``, ``b``); an added token marked
  ``normalized`` (MPNet's ``<unk>``) is split off the normalised text instead, so ``<UNK>`` is it too.
* Its character classes come from the ``unicode_categories`` crate, which has Unicode 8.0: clean_text drops
  Cc, Cf and Co (not the unassigned Cn), strip_accents drops Mn and P* splits words by *that* table, so a
  character assigned or re-categorised since is kept as it is.  Python's ``unicodedata`` is newer and
  changes with the Python version, so those three tables are spelled out below.
* Its NFD (``unicode-normalization-alignments``) has Unicode 9.0: it leaves a later character whole and
  gives it combining class 0; ``_nfd`` fences Python's newer NFD off from such characters.
* Lowercasing is Rust's, character by character: no final-sigma rule, and Rust's newer case pairs.
* Whitespace is Rust's ``char::is_whitespace``, not ``str.isspace`` (which adds U+001C-U+001F).
"""

from __future__ import annotations

import functools
import json
import re
import unicodedata
from os import PathLike
from pathlib import Path
from typing import Any, Iterator

__all__ = ["WordPieceTokenizer"]


def _code_points(spec: str) -> list[tuple[int, int]]:
    """``"300-36f 483"`` -> ``[(0x300, 0x36f), (0x483, 0x483)]``."""
    ranges = []
    for item in spec.split():
        start, _, end = item.partition("-")
        ranges.append((int(start, 16), int(end or start, 16)))
    return ranges


def _char_class(ranges: list[tuple[int, int]]) -> str:
    return "".join(f"\\U{a:08x}" if a == b else f"\\U{a:08x}-\\U{b:08x}" for a, b in ranges)


def _char_set(ranges: list[tuple[int, int]]) -> frozenset[str]:
    return frozenset(chr(cp) for a, b in ranges for cp in range(a, b + 1))


# The tables below were read off tokenizers 0.23.3 one code point at a time; tests/adapters/test_wordpiece.py
# sweeps every code point against it again.
# clean_text drops these (Cc, Cf and Co in Unicode 8.0; \t, \n and \r are whitespace instead) and U+FFFD.
_CONTROL = _code_points("""
    0-8 b-c e-1f 7f-9f ad 600-605 61c 6dd 70f 180e 200b-200f 202a-202e 2060-2064 2066-206f e000-f8ff feff
    fff9-fffb 110bd 1bca0-1bca3 1d173-1d17a e0001 e0020-e007f f0000-ffffd 100000-10fffd
""")
# strip_accents drops these after NFD (Mn in Unicode 8.0, and U+1734, Mc since Unicode 14.0).
_NONSPACING_MARKS = _code_points("""
    300-36f 483-487 591-5bd 5bf 5c1-5c2 5c4-5c5 5c7 610-61a 64b-65f 670 6d6-6dc 6df-6e4 6e7-6e8 6ea-6ed 711
    730-74a 7a6-7b0 7eb-7f3 816-819 81b-823 825-827 829-82d 859-85b 8e3-902 93a 93c 941-948 94d 951-957 962-963
    981 9bc 9c1-9c4 9cd 9e2-9e3 a01-a02 a3c a41-a42 a47-a48 a4b-a4d a51 a70-a71 a75 a81-a82 abc ac1-ac5 ac7-ac8
    acd ae2-ae3 b01 b3c b3f b41-b44 b4d b56 b62-b63 b82 bc0 bcd c00 c3e-c40 c46-c48 c4a-c4d c55-c56 c62-c63 c81
    cbc cbf cc6 ccc-ccd ce2-ce3 d01 d41-d44 d4d d62-d63 dca dd2-dd4 dd6 e31 e34-e3a e47-e4e eb1 eb4-eb9 ebb-ebc
    ec8-ecd f18-f19 f35 f37 f39 f71-f7e f80-f84 f86-f87 f8d-f97 f99-fbc fc6 102d-1030 1032-1037 1039-103a
    103d-103e 1058-1059 105e-1060 1071-1074 1082 1085-1086 108d 109d 135d-135f 1712-1714 1732-1734 1752-1753
    1772-1773 17b4-17b5 17b7-17bd 17c6 17c9-17d3 17dd 180b-180d 18a9 1920-1922 1927-1928 1932 1939-193b
    1a17-1a18 1a1b 1a56 1a58-1a5e 1a60 1a62 1a65-1a6c 1a73-1a7c 1a7f 1ab0-1abd 1b00-1b03 1b34 1b36-1b3a 1b3c
    1b42 1b6b-1b73 1b80-1b81 1ba2-1ba5 1ba8-1ba9 1bab-1bad 1be6 1be8-1be9 1bed 1bef-1bf1 1c2c-1c33 1c36-1c37
    1cd0-1cd2 1cd4-1ce0 1ce2-1ce8 1ced 1cf4 1cf8-1cf9 1dc0-1df5 1dfc-1dff 20d0-20dc 20e1 20e5-20f0 2cef-2cf1
    2d7f 2de0-2dff 302a-302d 3099-309a a66f a674-a67d a69e-a69f a6f0-a6f1 a802 a806 a80b a825-a826 a8c4
    a8e0-a8f1 a926-a92d a947-a951 a980-a982 a9b3 a9b6-a9b9 a9bc a9e5 aa29-aa2e aa31-aa32 aa35-aa36 aa43 aa4c
    aa7c aab0 aab2-aab4 aab7-aab8 aabe-aabf aac1 aaec-aaed aaf6 abe5 abe8 abed fb1e fe00-fe0f fe20-fe2f 101fd
    102e0 10376-1037a 10a01-10a03 10a05-10a06 10a0c-10a0f 10a38-10a3a 10a3f 10ae5-10ae6 11001 11038-11046
    1107f-11081 110b3-110b6 110b9-110ba 11100-11102 11127-1112b 1112d-11134 11173 11180-11181 111b6-111be
    111ca-111cc 1122f-11231 11234 11236-11237 112df 112e3-112ea 11300-11301 1133c 11340 11366-1136c 11370-11374
    114b3-114b8 114ba 114bf-114c0 114c2-114c3 115b2-115b5 115bc-115bd 115bf-115c0 115dc-115dd 11633-1163a 1163d
    1163f-11640 116ab 116ad 116b0-116b5 116b7 1171d-1171f 11722-11725 11727-1172b 16af0-16af4 16b30-16b36
    16f8f-16f92 1bc9d-1bc9e 1d167-1d169 1d17b-1d182 1d185-1d18b 1d1aa-1d1ad 1d242-1d244 1da00-1da36 1da3b-1da6c
    1da75 1da84 1da9b-1da9f 1daa1-1daaf 1e8d0-1e8d6 e0100-e01ef
""")
# BertPreTokenizer isolates these: ASCII punctuation (which includes $+<=>^`|~) and P* in Unicode 8.0.
_PUNCTUATION = _code_points("""
    21-2f 3a-40 5b-60 7b-7e a1 a7 ab b6-b7 bb bf 37e 387 55a-55f 589-58a 5be 5c0 5c3 5c6 5f3-5f4 609-60a 60c-60d
    61b 61e-61f 66a-66d 6d4 700-70d 7f7-7f9 830-83e 85e 964-965 970 af0 df4 e4f e5a-e5b f04-f12 f14 f3a-f3d f85
    fd0-fd4 fd9-fda 104a-104f 10fb 1360-1368 1400 166d-166e 169b-169c 16eb-16ed 1735-1736 17d4-17d6 17d8-17da
    1800-180a 1944-1945 1a1e-1a1f 1aa0-1aa6 1aa8-1aad 1b5a-1b60 1bfc-1bff 1c3b-1c3f 1c7e-1c7f 1cc0-1cc7 1cd3
    2010-2027 2030-2043 2045-2051 2053-205e 207d-207e 208d-208e 2308-230b 2329-232a 2768-2775 27c5-27c6
    27e6-27ef 2983-2998 29d8-29db 29fc-29fd 2cf9-2cfc 2cfe-2cff 2d70 2e00-2e2e 2e30-2e42 3001-3003 3008-3011
    3014-301f 3030 303d 30a0 30fb a4fe-a4ff a60d-a60f a673 a67e a6f2-a6f7 a874-a877 a8ce-a8cf a8f8-a8fa a8fc
    a92e-a92f a95f a9c1-a9cd a9de-a9df aa5c-aa5f aade-aadf aaf0-aaf1 abeb fd3e-fd3f fe10-fe19 fe30-fe52
    fe54-fe61 fe63 fe68 fe6a-fe6b ff01-ff03 ff05-ff0a ff0c-ff0f ff1a-ff1b ff1f-ff20 ff3b-ff3d ff3f ff5b ff5d
    ff5f-ff65 10100-10102 1039f 103d0 1056f 10857 1091f 1093f 10a50-10a58 10a7f 10af0-10af6 10b39-10b3f
    10b99-10b9c 11047-1104d 110bb-110bc 110be-110c1 11140-11143 11174-11175 111c5-111c9 111cd 111db 111dd-111df
    11238-1123d 112a9 114c6 115c1-115d7 11641-11643 1173c-1173e 12470-12474 16a6e-16a6f 16af5 16b37-16b3b 16b44
    1bc9f 1da87-1da8b
""")
# Combining marks whose combining class tokenizers' NFD (Unicode 9.0) knows although they are not Mn above
# (Unicode 9.0 marks and a few spacing marks): they survive strip_accents but still take part in reordering.
_NFD_ONLY_MARKS = _code_points("""
    8d4-8e1 1b44 1baa 1bf2-1bf3 1dfb 302e-302f a953 a9c0 111c0 11235 1134d 11442 11446 116b6 11c3f 1d165-1d166
    1d16d-1d172 1e000-1e006 1e008-1e018 1e01b-1e021 1e023-1e024 1e026-1e02a 1e944-1e94a
""")
# The characters above U+FFFF that tokenizers' NFD decomposes.  Every canonical decomposition added since
# Unicode 9.0 (U+11938 in 13.0, twenty more up to 18.0) is above U+FFFF, so those in the BMP need no table.
_NFD_SUPPLEMENTARY = _code_points("""
    1109a 1109c 110ab 1112e-1112f 1134b-1134c 114bb-114bc 114be 115ba-115bb 1d15e-1d164 1d1bb-1d1c0 2f800-2fa1d
""")

# Rust's char::is_whitespace (White_Space).
_WHITESPACE = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
# BertNormalizer's "Chinese characters" (note the gap U+2B820-U+2B91F, which tokenizers leaves out).
_CJK = [(0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F),
        (0x2B920, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F)]
# Rust lowercases these and Python 3.11 (Unicode 14.0) does not: the case pairs of Unicode 16.0 and 17.0, which
# tokenizers 0.23.3 was built with.  A newer Python lowercases them itself.
_LOWERCASE_GAP = {0x1C89: 0x1C8A, 0xA7CB: 0x0264, 0xA7CC: 0xA7CD, 0xA7CE: 0xA7CF, 0xA7D2: 0xA7D3, 0xA7D4: 0xA7D5,
                  0xA7DA: 0xA7DB, 0xA7DC: 0x019B,
                  **{cp: cp + 0x20 for cp in range(0x10D50, 0x10D66)},   # Garay
                  **{cp: cp + 0x1B for cp in range(0x16EA0, 0x16EB9)}}   # Beria Erfe
_LOWERCASE_GAP_FROM = chr(min(_LOWERCASE_GAP))

_CONTROL_RE = re.compile(f"[{_char_class(_CONTROL)}\ufffd]+")
_SPACE_RE = re.compile(f"[{_WHITESPACE}]")
_CJK_RE = re.compile(f"[{_char_class(_CJK)}]")
_MARKS_RE = re.compile(f"[{_char_class(_NONSPACING_MARKS)}]+")
_PUNCT = _char_class(_PUNCTUATION)
_WORD_RE = re.compile(f"[{_PUNCT}]|[^{_PUNCT}{_WHITESPACE}]+")
_SURROGATE_RE = re.compile("[\ud800-\udfff]")
_NFD_KNOWN_MARKS = _char_set(_NONSPACING_MARKS) | _char_set(_NFD_ONLY_MARKS)
_NFD_KNOWN_SUPPLEMENTARY = _char_set(_NFD_SUPPLEMENTARY)


def _unknown_to_nfd(c: str) -> bool:
    """True for a character Python's NFD would reorder or decompose and tokenizers' NFD does not know."""
    if unicodedata.combining(c):
        return c not in _NFD_KNOWN_MARKS
    return c > "\uffff" and c not in _NFD_KNOWN_SUPPLEMENTARY and unicodedata.decomposition(c)[:1] not in ("", "<")


def _nfd(text: str) -> str:
    """NFD as tokenizers does it: a character its tables do not know stays whole and, having combining class 0
    there, bounds the reordering of the marks around it, so the text is normalised piecewise around it."""
    if unicodedata.is_normalized("NFD", text):  # then tokenizers' older NFD changes nothing either
        return text
    pieces: list[str] = []
    start = 0
    for i, c in enumerate(text):
        if c >= "\u0300" and _unknown_to_nfd(c):
            pieces += (unicodedata.normalize("NFD", text[start:i]), c)
            start = i + 1
    pieces.append(unicodedata.normalize("NFD", text[start:]))
    return "".join(pieces)


class WordPieceTokenizer:
    """BertNormalizer + BertPreTokenizer + WordPiece + a ``[CLS] $A [SEP]`` template, as ``tokenizers`` runs
    them; thread-safe (no mutable state but a bounded cache of each word's pieces)."""

    def __init__(self, vocab: dict[str, int], *, unk_token: str = "[UNK]", continuing_subword_prefix: str = "##",
                 max_input_chars_per_word: int = 100, clean_text: bool = True, handle_chinese_chars: bool = True,
                 strip_accents: bool | None = None, lowercase: bool = True, added_tokens: dict[str, int] | None = None,
                 normalized_added_tokens: dict[str, int] | None = None, prefix_ids: tuple[int, ...] = (), suffix_ids: tuple[int, ...] = (), cache_size: int = 4096) -> None:
        if unk_token not in vocab:
            raise ValueError(f"The unknown token {unk_token!r} is not in the vocabulary")
        self._vocab = dict(vocab)
        self._unk = (vocab[unk_token],)
        self._continuing = continuing_subword_prefix
        self._max_chars = max_input_chars_per_word
        self._longest = max(map(len, vocab))  # no piece is longer: bounds the longest-match search
        self._clean_text = clean_text
        self._chinese = handle_chinese_chars
        self._strip_accents = lowercase if strip_accents is None else strip_accents  # tokenizers' default
        self._lowercase = lowercase
        self._added = dict(added_tokens or {})
        # tokenizers matches these in the raw text, and those marked normalized in each normalised rest (their
        # own text normalised too); a token's id does not depend on the pass that found it
        self._normalized_added = {self._normalize(token): i for token, i in (normalized_added_tokens or {}).items()}
        self._added_re = _alternation(self._added)
        self._normalized_added_re = _alternation(self._normalized_added)
        self._prefix_ids, self._suffix_ids = list(prefix_ids), list(suffix_ids)
        self._word_ids = functools.lru_cache(maxsize=cache_size)(self._wordpiece)

    @classmethod
    def from_file(cls, path: str | PathLike[str], cache_size: int = 4096) -> WordPieceTokenizer:
        """Read a ``tokenizer.json``; ValueError (naming the file) for any other kind of tokenizer."""
        try:
            spec = json.loads(Path(path).read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"{path} is not a tokenizer.json ({exc})") from None
        try:
            return cls(**_settings(spec), cache_size=cache_size)
        except (_Refused, KeyError, TypeError, AttributeError, StopIteration) as exc:
            what = str(exc) if isinstance(exc, _Refused) else f"malformed ({type(exc).__name__}: {exc})"
            raise ValueError(f"{path} is not a BERT WordPiece tokenizer of the kind WordPieceTokenizer "
                             f"implements: {what}") from None

    def token_to_id(self, token: str) -> int | None:
        added = self._added.get(token, self._normalized_added.get(token))
        return self._vocab.get(token) if added is None else added

    def encode(self, text: str, max_length: int) -> list[int]:
        """The ids of `text` with the template's special tokens, the text's own tokens cut so that the whole is
        at most `max_length` long (as ``tokenizers`` truncates one sequence)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, not {type(text).__name__}")
        budget = max_length - len(self._prefix_ids) - len(self._suffix_ids)
        if budget < 0:  # tokenizers silently stops truncating here
            raise ValueError(f"max_length {max_length} leaves no room for the special tokens")
        if not text.isascii() and _SURROGATE_RE.search(text):  # tokenizers cannot take it either (no UTF-8)
            raise ValueError("text holds a lone surrogate, which is not valid Unicode")
        ids: list[int] = []
        for piece, added in _split(text, self._added_re):
            if added:
                ids.append(self._added[piece])
            else:
                for inner, normalized_added in _split(self._normalize(piece), self._normalized_added_re):
                    if normalized_added:
                        ids.append(self._normalized_added[inner])
                        continue
                    for word in _WORD_RE.findall(inner):
                        ids += self._word_ids(word)
                        if len(ids) >= budget:  # the rest would be cut
                            break
                    if len(ids) >= budget:
                        break
            if len(ids) >= budget:
                break
        return self._prefix_ids + ids[:budget] + self._suffix_ids

    def _normalize(self, text: str) -> str:
        """BertNormalizer: clean_text, handle_chinese_chars, strip_accents, lowercase, in that order."""
        ascii_only = text.isascii()
        if self._clean_text:
            text = _SPACE_RE.sub(" ", _CONTROL_RE.sub("", text))
        if ascii_only:  # nothing below but lowercasing touches ASCII
            return text.lower() if self._lowercase else text
        if self._chinese:
            text = _CJK_RE.sub(r" \g<0> ", text)
        if self._strip_accents:
            text = _MARKS_RE.sub("", _nfd(text))
        if self._lowercase:
            # Rust lowercases character by character: a final capital sigma becomes σ, never ς
            text = text.replace("Σ", "σ").lower()
            if text and max(text) >= _LOWERCASE_GAP_FROM:
                text = text.translate(_LOWERCASE_GAP)
        return text

    def _wordpiece(self, word: str) -> tuple[int, ...]:
        """Greedy longest-match-first pieces of one word; a word with an unmatchable rest is one [UNK]."""
        if len(word) > self._max_chars:  # counted in characters, as tokenizers does
            return self._unk
        vocab, ids, start = self._vocab, [], 0
        while start < len(word):
            end = min(len(word), start + self._longest)
            while end > start:
                piece = word[start:end] if start == 0 else self._continuing + word[start:end]
                if piece in vocab:
                    ids.append(vocab[piece])
                    break
                end -= 1
            else:
                return self._unk
            start = end
        return tuple(ids)


def _alternation(tokens: dict[str, int]) -> re.Pattern[str] | None:
    """tokenizers matches added tokens leftmost-longest; a regex alternation tried longest first does the same."""
    if not tokens:
        return None
    return re.compile("(" + "|".join(map(re.escape, sorted(tokens, key=len, reverse=True))) + ")")


def _split(text: str, added_re: re.Pattern[str] | None) -> Iterator[tuple[str, bool]]:
    """The non-empty pieces of `text`, each with whether it is an added token `added_re` matched."""
    if added_re is None:
        if text:
            yield text, False
        return
    for i, piece in enumerate(added_re.split(text)):  # split() alternates text and captured added tokens
        if i % 2 or piece:
            yield piece, bool(i % 2)


class _Refused(Exception):
    pass


def _settings(spec: dict[str, Any]) -> dict[str, Any]:
    """WordPieceTokenizer's keyword arguments from a parsed tokenizer.json; _Refused for anything it does not
    implement (its truncation and padding sections are ignored: encode takes max_length and does not pad)."""
    def require(ok: object, what: str) -> None:
        if not ok:
            raise _Refused(what)

    model, normalizer, pre, post = (spec.get(k) or {} for k in ("model", "normalizer", "pre_tokenizer",
                                                                 "post_processor"))
    require(model.get("type") == "WordPiece", f"model type {model.get('type')!r}, not 'WordPiece'")
    require(normalizer.get("type") == "BertNormalizer",
            f"normalizer type {normalizer.get('type')!r}, not 'BertNormalizer'")
    require(pre.get("type") == "BertPreTokenizer", f"pre_tokenizer type {pre.get('type')!r}, not 'BertPreTokenizer'")
    require(post.get("type") in ("TemplateProcessing", "RobertaProcessing"),
            f"post_processor type {post.get('type')!r}, not 'TemplateProcessing' or 'RobertaProcessing'")
    flags = {k: normalizer[k] for k in ("clean_text", "handle_chinese_chars", "lowercase")}
    require(all(isinstance(v, bool) for v in flags.values()), f"normalizer flags {flags}")
    require(normalizer.get("strip_accents") in (None, True, False), "normalizer strip_accents")
    vocab = model["vocab"]
    require(isinstance(vocab, dict) and all(isinstance(i, int) for i in vocab.values()), "model vocab")
    require(model["unk_token"] in vocab, f"unk_token {model['unk_token']!r} is not in the vocab")

    added: dict[str, int] = {}
    normalized_added: dict[str, int] = {}
    for token in spec.get("added_tokens") or []:
        # lstrip / rstrip widen a match over the whitespace beside it, which BertPreTokenizer drops anyway
        require(not token.get("single_word"), f"added token {token.get('content')!r} with single_word")
        (normalized_added if token.get("normalized") else added)[token["content"]] = token["id"]
    settings = dict(vocab=vocab, unk_token=model["unk_token"], continuing_subword_prefix=model["continuing_subword_prefix"],
                    max_input_chars_per_word=model["max_input_chars_per_word"],
                    strip_accents=normalizer["strip_accents"], **flags, added_tokens=added,
                    normalized_added_tokens=normalized_added)
    if post["type"] == "RobertaProcessing":  # one sequence: <s> $A </s>
        return dict(settings, prefix_ids=(post["cls"][1],), suffix_ids=(post["sep"][1],))

    # The single-sequence template: special tokens around exactly one $A.
    template = [next(iter(item.items())) for item in post["single"]]
    kinds = [kind for kind, _ in template]
    require(kinds.count("Sequence") == 1 and set(kinds) <= {"Sequence", "SpecialToken"}
            and dict(template)["Sequence"]["id"] == "A", f"post_processor single template {post['single']}")
    at = kinds.index("Sequence")

    def special_ids(items: list[tuple[str, Any]]) -> tuple[int, ...]:
        return tuple(i for _, value in items for i in post["special_tokens"][value["id"]]["ids"])

    return dict(settings, prefix_ids=special_ids(template[:at]), suffix_ids=special_ids(template[at + 1:]))
