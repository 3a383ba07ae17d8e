"""adapters/wordpiece.py: the pure-Python BERT WordPiece tokenizer, id for id against ``tokenizers``.

The comparisons need ``tokenizers`` (skipped without it); each fails on the first text whose ids differ and
names it.  ``tokenizers`` runs with ``enable_truncation(max_length)`` and no padding: the embedder pads itself.
"""

from __future__ import annotations

import functools
import json
import random
from pathlib import Path

import pytest

from amfs_server.adapters import wordpiece
from amfs_server.adapters.wordpiece import WordPieceTokenizer
from amfs_server.core.embedding import entry_texts

MODELS = Path(wordpiece.__file__).parent / "models"
TOKENIZER_JSON = MODELS / "all-MiniLM-L6-v2" / "tokenizer.json"
# MPNet's: the same normaliser and pre-tokenizer, `<s> $A </s>` (RobertaProcessing), a normalized <unk> added token
MPNET_TOKENIZER_JSON = MODELS / "chat-mpnet" / "tokenizer.json"
DATA = Path(wordpiece.__file__).parent.parent / "session_bench" / "data"
EMBEDDER_MAX_LENGTH = 256  # OnnxEmbedder's default

HARD_CASES = [
    "", " ", "   \t\n\r  ", "\u00a0\u2003\u3000\u2028\u2029\u202f\u205f\u1680", "!!!", "?!.,;:'\"()[]{}<>",
    "$+<=>^`|~ are ASCII punctuation but Unicode symbols", "¿Qué? ¡Sí! «guillemets» „Anführung“ ‹›",
    "naïve café résumé Ångström Ælfred Øresund œuvre", "Straße STRASSE ß ẞ", "İstanbul ISTANBUL ıi İİ",
    "ΣΑΣ ΟΔΥΣΣΕΥΣ σοφός Σ ς σ", "Ǆemal ǅ ǆ ﬁnance ﬃ", "Ⅻ ⅻ ① ² ½ ｈｅｌｌｏ ＡＢＣ！", "µ Å K Ω",
    "日本語のテキスト 中文字符 한국어 텍스트", "\U00020000\U0002a700\U0002b740 gap \U0002b820\U0002b91f\U0002b920 豈 丽",
    "emoji 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 🇫🇷 ❤️ 🥰",
    "zero\u200bwidth\u200cjoiner\u200dnon-joiner\u2060word\ufeffjoiner", "soft\u00adhyphen",
    "\u0301\u0308 alone \u0301",
    "e\u0301 e\u0301\u0323 q\u0323\u0307 a\u0328\u0301", "control\x00chars\x01\x07\x1b[31m\x7f\x85\x9f here",
    "form\x0cfeed vertical\x0btab file\x1csep\x1d\x1e\x1f", "replacement \ufffd char", "private \ue000\U000f0000 use",
    "unassigned \u0378 \U000e0080 \U0010fffe", "new since Unicode 8: \u0890 \u08e2 \u2e43 \u07fd \U00011938 \u1734",
    "garay \U00010d50 latin \ua7cb\ua7dc beria \U00016ea0", "\u1ac1\u1ab0 a\u1ac1\u0316 x\U00011c3f\u0300",
    "x" * 100, "y" * 101, "supercalifragilisticexpialidocious" * 3 + "!", "ab" * 60 + " short",
    "a[SEP]b [CLS] [cls] [[SEP]] [UNK][MASK][PAD] [SEP", "[SEP]", "[CLS][SEP]",
    "<s>x</s> <pad> <unk> <UNK> <Unk>b a<mask> b <MASK> << unk >> <<unk>> </s", "<unk>", "  <mask>  ",
    "def f(x): return {'k': [1, 2, 3]} if x >= 0 else None  # comment",
    "for (int i = 0; i < n; ++i) { a[i] ^= b[i] << 2; }", "SELECT * FROM t WHERE a->>'b' = 'c';",
    "https://example.com/path/to?q=a+b&x=%20y#frag user@example.org C:\\Users\\x\\file.txt",
    "2024-06-11T10:15:30Z 3.14159 1,000,000 -42 +7 50% $100 €20 £5 ¥3",
    "tab\tseparated\tvalues\nnew line\r\nwindows", "Zürich, Kraków, São Paulo, Reykjavík, Đà Nẵng",
    "עברית العربية हिन्दी ไทย ქართული Ελληνικά русский", "ﷺ ﷽ ﻼ", "Ꭰ ꭰ Ᏸ", "〈〉《》「」『』【】〔〕",
]


@pytest.fixture(scope="module", params=[TOKENIZER_JSON, MPNET_TOKENIZER_JSON], ids=["minilm", "mpnet"])
def tokenizer_json(request) -> Path:
    return request.param


@pytest.fixture(scope="module")
def ours(tokenizer_json) -> WordPieceTokenizer:
    return WordPieceTokenizer.from_file(tokenizer_json)


@pytest.fixture(scope="module")
def reference(tokenizer_json):
    tokenizers = pytest.importorskip("tokenizers")
    return _reference(tokenizers.Tokenizer.from_file(str(tokenizer_json)))


@pytest.fixture(scope="module")
def minilm() -> WordPieceTokenizer:
    return WordPieceTokenizer.from_file(TOKENIZER_JSON)


def _reference(tokenizer):
    tokenizer.no_padding()

    def encode(texts: list[str], max_length: int) -> list[list[int]]:
        tokenizer.enable_truncation(max_length=max_length)
        return [e.ids for e in tokenizer.encode_batch(texts)]

    return encode


def assert_same_ids(ours: WordPieceTokenizer, reference, texts: list[str], max_length: int) -> None:
    for text, expected in zip(texts, reference(texts, max_length), strict=True):
        got = ours.encode(text, max_length)
        if got != expected:
            pytest.fail(f"ids differ for {text!r} (max_length {max_length}):\n"
                        f"  wordpiece:  {got}\n  tokenizers: {expected}")


# --------------------------------------------------------------------------- #
# The project's own texts
# --------------------------------------------------------------------------- #

@functools.cache
def conversation_texts() -> list[str]:
    texts = []
    for conversation in json.loads((DATA / "conversations_eval.json").read_text())["conversations"]:
        for session in conversation["sessions"]:
            for turn in session["turns"]:
                value = f"{turn['speaker']}: {turn['text']}"  # as stored
                texts += [turn["text"], f"chat message: {value}"]
                texts += entry_texts(conversation["conversation_id"], turn["key"], value).sentences  # its sentences
        texts += [q["question"] for q in conversation["questions"]]
    return list(dict.fromkeys(texts))


def memory_texts() -> list[str]:
    retrieval = json.loads((DATA / "retrieval_eval.json").read_text())
    example = json.loads((DATA / "example_session.json").read_text())
    texts = []
    for m in retrieval["memories"]:
        texts += [m["value"] if isinstance(m["value"], str) else json.dumps(m["value"])]
        whole, sentences = entry_texts(m["entity_path"], m["key"], m["value"])
        texts += [whole, *sentences]
    for f in example["facts"]:
        texts += [f["text"], *entry_texts(f["entity_path"], f["key"], f["text"]).sentences]
    texts += [q["question"] for q in retrieval["questions"]] + [q["question"] for q in example["queries"]]
    return list(dict.fromkeys(texts))


def test_every_conversation_turn_and_question_gets_the_ids_tokenizers_gives(ours, reference):
    texts = conversation_texts()
    assert len(texts) > 9_000, len(texts)
    assert_same_ids(ours, reference, texts, EMBEDDER_MAX_LENGTH)
    assert_same_ids(ours, reference, texts[::7], 16)


def test_every_agent_memory_and_question_gets_the_ids_tokenizers_gives(ours, reference):
    texts = memory_texts()
    assert len(texts) > 1_000
    assert_same_ids(ours, reference, texts, EMBEDDER_MAX_LENGTH)
    assert_same_ids(ours, reference, texts, 16)


def test_hard_unicode_and_code_texts_get_the_ids_tokenizers_gives(ours, reference):
    assert_same_ids(ours, reference, HARD_CASES, EMBEDDER_MAX_LENGTH)
    assert_same_ids(ours, reference, HARD_CASES, 8)


# --------------------------------------------------------------------------- #
# Seeded fuzz
# --------------------------------------------------------------------------- #

def _random_code_point(rng: random.Random) -> str:
    while True:
        cp = rng.randrange(0x110000)
        if not 0xD800 <= cp <= 0xDFFF:
            return chr(cp)


@functools.cache
def vocabulary(tokenizer_json: Path = TOKENIZER_JSON) -> list[str]:
    return list(json.loads(tokenizer_json.read_text())["model"]["vocab"])


def fuzz_texts(n: int, seed: int = 20240611) -> list[str]:
    rng = random.Random(seed)
    vocab = vocabulary()
    spicy = list("\t\n\r \u00a0\u2003\u3000\u200b\u200d\u00ad\ufeff\ufffd\x00\x1f\x85\u0301\u0308\u0323\u1ac1"
                 "ΣσςİıßẞǅÅΩ中日한👍!?.,'\"-_[]\u2e43\u0890") + ["[SEP]", "[CLS]", "[UNK]", "[MASK]", "[PAD]", "[SEP",
                                                        "<s>", "</s>", "<pad>", "<unk>", "<UNK>", "<mask>", "<"]
    alphabets = [
        lambda: chr(rng.randrange(0x20, 0x7F)),                                   # printable ASCII
        lambda: chr(rng.randrange(0x80)),                                         # ASCII incl. controls
        lambda: chr(rng.randrange(0x80, 0x100)),                                  # Latin-1
        lambda: chr(rng.randrange(0x100, 0x3000)),                                # scripts, marks, symbols
        lambda: _random_code_point(rng),                                          # anything, unassigned too
        lambda: rng.choice(spicy),
        lambda: rng.choice(vocab).removeprefix("##"),                             # multi-piece words
        lambda: rng.choice(vocab) + " ",
    ]
    texts = []
    for _ in range(n):
        mix = rng.sample(alphabets, rng.randint(1, 3))
        texts.append("".join(rng.choice(mix)() for _ in range(rng.randint(0, 40))))
    return texts


def test_random_strings_get_the_ids_tokenizers_gives(ours, reference):
    texts = fuzz_texts(4000)
    assert_same_ids(ours, reference, texts, EMBEDDER_MAX_LENGTH)
    assert_same_ids(ours, reference, texts[:1000], 8)


@pytest.mark.parametrize("max_length", [2, 3, 8, 16, 256])
def test_long_texts_are_cut_where_tokenizers_cuts_them(ours, reference, max_length):
    turns = conversation_texts()[:4000:4]
    rng = random.Random(max_length)
    long_texts = [" ".join(rng.sample(turns, 40)) for _ in range(30)]
    long_texts += [" ".join(fuzz_texts(60, seed=max_length + i)) for i in range(10)]
    long_texts += ["[SEP] " * 300, "word " * 1000, "x" * 5000]
    assert_same_ids(ours, reference, long_texts, max_length)


def test_every_code_point_normalises_and_splits_as_tokenizers_does(minilm):
    """The Unicode tables: every code point (a sample of the unassigned planes 4 to 13) through the normaliser,
    in code-point order and reversed so that neighbouring marks are reordered too, and raw through the
    pre-tokenizer's whitespace and punctuation split (planes 0, 1 and 14: the others hold only ideographs,
    private use and unassigned code points)."""
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer.from_file(str(TOKENIZER_JSON))
    unassigned = range(0x40000, 0xE0000)  # planes 4 to 13: a sample is enough
    everything = "".join(chr(cp) for cp in range(0x110000)
                         if not 0xD800 <= cp <= 0xDFFF and (cp not in unassigned or cp % 61 == 0))
    for text in (everything, everything[:0x20000][::-1]):  # reversed: marks meet in other orders
        expected, got = tok.normalizer.normalize_str(text), minilm._normalize(text)
        if got != expected:
            at = next(i for i, (a, b) in enumerate(zip(got, expected)) if a != b)
            pytest.fail(f"normalised text differs at {at}: {got[at - 5:at + 5]!r} != {expected[at - 5:at + 5]!r}")
    planes = "".join(chr(cp) for cp in [*range(0xD800), *range(0xE000, 0x20000), *range(0xE0000, 0xF0000)])
    expected_words = [word for word, _ in tok.pre_tokenizer.pre_tokenize_str(planes)]
    assert wordpiece._WORD_RE.findall(planes) == expected_words


FLAGS = [dict(clean_text=c, handle_chinese_chars=h, strip_accents=s, lowercase=lo)
         for c, h, s, lo in [(False, True, None, True), (True, False, None, True), (True, True, None, False),
                             (True, True, True, False), (True, True, False, True), (False, False, False, False)]]


@pytest.mark.parametrize("flags", FLAGS, ids=lambda f: "-".join(f"{k}={v}" for k, v in f.items()))
def test_other_normaliser_settings_match_tokenizers(tmp_path, flags):
    tokenizers = pytest.importorskip("tokenizers")
    spec = json.loads(TOKENIZER_JSON.read_text())
    spec["normalizer"].update(flags)
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(spec))
    texts = HARD_CASES + fuzz_texts(150, seed=7)
    assert_same_ids(WordPieceTokenizer.from_file(path), _reference(tokenizers.Tokenizer.from_file(str(path))),
                    texts, 64)


def test_token_to_id_matches_tokenizers_over_the_whole_vocab(ours, tokenizer_json):
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer.from_file(str(tokenizer_json))
    for token in [*vocabulary(tokenizer_json), "[CLS]", "[MASK]", "not-a-token", "", "##", "Hello", "[cls]",
                  "<s>", "<pad>", "<unk>", "<mask>", "<UNK>"]:
        assert ours.token_to_id(token) == tok.token_to_id(token), token


# --------------------------------------------------------------------------- #
# Without tokenizers
# --------------------------------------------------------------------------- #

def test_known_ids_hold_without_tokenizers_installed(minilm):
    assert minilm.encode("Hello, World! naïve café", 256) == [101, 7592, 1010, 2088, 999, 15743, 7668, 102]
    assert minilm.encode("a[SEP]b", 256) == [101, 1037, 102, 1038, 102]
    assert minilm.encode("", 256) == [101, 102]
    assert minilm.encode("one two three four", 4) == [101, 2028, 2048, 102]
    assert minilm.encode("x" * 101, 8) == [101, 100, 102]
    assert minilm.token_to_id("[CLS]") == 101 and minilm.token_to_id("[PAD]") == 0
    assert minilm.token_to_id("hello") == 7592 and minilm.token_to_id("##ing") == 2075
    assert minilm.token_to_id("not-a-token") is None


def test_mpnet_known_ids_hold_without_tokenizers_installed():
    mpnet = WordPieceTokenizer.from_file(MPNET_TOKENIZER_JSON)
    assert mpnet.encode("hello world", 256) == [0, 7596, 2092, 2]  # <s> ... </s>
    assert mpnet.encode("<UNK> a <unk>b", 256) == [0, 3, 1041, 3, 1042, 2]  # <unk> is matched once normalised
    assert mpnet.encode("a <mask> b", 256) == [0, 1041, 30526, 1042, 2]
    assert mpnet.encode("", 256) == [0, 2]
    assert mpnet.token_to_id("<pad>") == 1 and mpnet.token_to_id("<unk>") == 3


def test_bad_input_is_refused_with_a_clear_error(ours):
    with pytest.raises(ValueError, match="max_length 1"):
        ours.encode("hello", 1)
    with pytest.raises(ValueError, match="surrogate"):
        ours.encode("a\ud800b", 256)
    with pytest.raises(TypeError):
        ours.encode(b"bytes", 256)  # type: ignore[arg-type]


def test_word_cache_is_bounded(ours):
    assert ours._word_ids.cache_info().maxsize == 4096


def _set(spec: dict, path: str, value: object) -> None:
    *parents, last = path.split(".")
    for key in parents:
        spec = spec[int(key)] if isinstance(spec, list) else spec[key]
    spec[last] = value


@pytest.mark.parametrize("path, value, reason", [
    ("model.type", "BPE", "model type 'BPE'"),
    ("normalizer", {"type": "Lowercase"}, "normalizer type 'Lowercase'"),
    ("normalizer", None, "normalizer type None"),
    ("pre_tokenizer", {"type": "Whitespace"}, "pre_tokenizer type 'Whitespace'"),
    ("post_processor", {"type": "BertProcessing", "sep": ["[SEP]", 102], "cls": ["[CLS]", 101]},
     "post_processor type 'BertProcessing'"),
    ("post_processor.single", [{"SpecialToken": {"id": "[CLS]", "type_id": 0}}], "single template"),
    ("added_tokens.2.single_word", True, "'\\[CLS\\]' with single_word"),
    ("normalizer.lowercase", "yes", "normalizer flags"),
    ("model.vocab", None, "model vocab"),
    ("model.unk_token", "<unk>", "unk_token '<unk>' is not in the vocab"),
    ("post_processor.special_tokens", {}, "malformed"),
])
def test_refuses_other_kinds_of_tokenizer(tmp_path, path, value, reason):
    spec = json.loads(TOKENIZER_JSON.read_text())
    spec["model"]["vocab"] = {token: i for token, i in spec["model"]["vocab"].items() if i < 1000}  # quicker
    _set(spec, path, value)
    bad = tmp_path / "other-tokenizer.json"
    bad.write_text(json.dumps(spec))
    with pytest.raises(ValueError, match=f"other-tokenizer.json is not a BERT WordPiece .*{reason}"):
        WordPieceTokenizer.from_file(bad)


def test_refuses_a_file_that_is_not_json(tmp_path):
    bad = tmp_path / "tokenizer.json"
    bad.write_text("not json")
    with pytest.raises(ValueError, match="tokenizer.json is not a tokenizer.json"):
        WordPieceTokenizer.from_file(bad)


def test_module_does_not_import_tokenizers():
    source = Path(wordpiece.__file__).read_text()
    assert "import tokenizers" not in source and "from tokenizers" not in source
