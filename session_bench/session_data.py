"""Session fact sets and the prompt wording the session benchmark asks with.

This module owns the benchmark's *data*: the facts a session writes as
memories, the targeted-recall queries with their expected keywords and
distractor answers, the hit rules (strict, the default, and the lenient
substring rule reported beside it), the session-file format, and the seed
split between tuning and reporting. It holds no model code.

Two kinds of session:

* ``report_session(10 | 20)``: the report's protocol, 10 identity facts about
  the user and the same 10 queries; N=20 adds 10 distractors that share topics
  and wording with the facts (the user's sister's city, a previous employer, a
  colleague's editor) without answering any query.
* ``generated_session(seed)``: a larger session (60 facts, 60 queries by
  default) about several people, generated from attribute templates, so that
  every query has distractors of the same attribute for other people and
  differences between modes are not one query wide. Facts are written one
  person at a time (a choice made while looking at seeds 0 and 1, so reports
  use other reporting seeds). Seeds 100-199 are for tuning, 0-99 for reports.
* ``load_session_file(path)``: an external session (``parse_session`` has the
  format).

Designed for a weak reader (SmolLM2-135M): short facts phrased like their
questions ("The user's code editor is Neovim." / "What is the user's code
editor?"), single-word answers that no other fact or answer contains, and a
system prompt asking for a few words from the notes. With all ten facts in the
prompt (mode D) SmolLM2 answers 10/10 at N=10 and N=20, so the ceiling is real
and every other mode is judged against it. On the generated 60-fact sessions it
is not (32% over three seeds): there the benchmark's reference, the gold fact
alone as text (89%), is the reader's ceiling. (Both measured with the lenient
rule on seeds 0-2, before the strict rule and the seed split.)
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.errors import ValidationError
from ..core.service import MAX_QUERY_CHARS
from ..core.validation import serialize_value, validate_entity_path, validate_key

# Generated sessions' seeds are split once: knobs (key scale, top-k, templates) are chosen on tuning seeds,
# and a report is run on reporting seeds only, so no number a report states was looked at while tuning.
REPORTING_SEEDS = range(0, 100)
TUNING_SEEDS = range(100, 200)
SPLITS = {"report": REPORTING_SEEDS, "tuning": TUNING_SEEDS}


@dataclass(frozen=True)
class Fact:
    """One memory the session writes: ``entity_path``/``key`` -> ``text``."""

    entity_path: str
    key: str
    text: str

    @property
    def path(self) -> str:
        return f"{self.entity_path}/{self.key}"


# Scripts written without spaces between words (Chinese, Japanese, Thai, Lao, Khmer, Myanmar): a whole-word match
# can never succeed there ("王小明" in "工程师是王小明"; red-team finding, 0.7.12), so a word in them is matched as text.
_UNSPACED = re.compile("[\u0e00-\u0eff\u1000-\u109f\u1780-\u17ff\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")


# Arabic writes some words onto the next one: "بالقاهرة" is "in Cairo", and a whole-word match scored it a miss
# for "القاهرة" (red-team finding, 0.7.12). Before an Arabic word only its proclitic chain may come, each part
# optional, in this order: a conjunction (و and, ف so), a preposition (ب in, ك like, ل for), the article (ال); ل
# before the article is written لل. A word that has the article needs it in the answer too. Any other letter before
# the word is a miss ("معلم", teacher, does not name "علم", flag). A word whose own first letter is a proclitic's
# ("بحر", sea, reads as ب + "حر") cannot be told apart without a dictionary: such a hit is possible, and accepted.
_ARABIC = re.compile("[\u0600-\u06ff\u0750-\u077f\u08a0-\u08ff\ufb50-\ufdff\ufe70-\ufeff]")
_ARTICLE = "\u0627\u0644"  # ال
_CONJUNCTION = "[\u0648\u0641]?"  # و ف
_BEFORE_ARTICLE = f"{_CONJUNCTION}(?:[\u0628\u0643]?{_ARTICLE}|\u0644\u0644)"  # ال بال كال لل
_BEFORE_WORD = f"{_CONJUNCTION}(?:[\u0628\u0643]?(?:{_ARTICLE})?|\u0644\u0644?)"  # ب ك ل, ال بال كال لل, or none


def _arabic_pattern(word: str) -> str:
    """The regex of Arabic ``word`` with the proclitics it may carry (ال and one letter is a word of its own: الف)."""
    if word.startswith(_ARTICLE) and len(word) > len(_ARTICLE) + 1:
        return _BEFORE_ARTICLE + re.escape(word[len(_ARTICLE):])
    return _BEFORE_WORD + re.escape(word)


def mentions(answer: str, word: str) -> bool:
    """``word`` appears in ``answer`` as a whole word, case-insensitive ("Teodora" does not mention "Teodor"); a
    word in a script written without spaces, as text; an Arabic word, with the proclitics Arabic attaches to it."""
    word = word.strip()
    if _UNSPACED.search(word):
        return word.casefold() in answer.casefold()
    pattern = _arabic_pattern(word) if _ARABIC.match(word) else re.escape(word)
    return re.search(rf"(?<!\w){pattern}(?!\w)", answer, flags=re.IGNORECASE) is not None


@dataclass(frozen=True)
class Query:
    """A targeted-recall question; ``fact_path`` names the fact that answers it.

    ``distractors`` are the answers a wrong fact would give (the same attribute of other people or
    services); an answer that names one of them as well as the expected one has not chosen.
    """

    question: str
    expected: str
    fact_path: str
    distractors: tuple[str, ...] = ()

    def hit(self, answer: str) -> bool:
        """The strict rule, the benchmark's default: the expected keyword as a whole word, no distractor."""
        return mentions(answer, self.expected) and not any(mentions(answer, d) for d in self.distractors)

    def hit_lenient(self, answer: str) -> bool:
        """The report's original rule, shown beside the strict one: the keyword as a substring, case-insensitive, or
        mentioned as the strict rule finds it (Arabic "للقاهرة" holds no "القاهرة"): lenient is never below strict."""
        return self.expected.lower() in answer.lower() or mentions(answer, self.expected)


@dataclass(frozen=True)
class Session:
    name: str
    facts: tuple[Fact, ...]
    queries: tuple[Query, ...]

    def fact(self, path: str) -> Fact:
        return next(f for f in self.facts if f.path == path)


# ---------------------------------------------------------------------------
# The report's session: N=10 identity facts, +10 distractors for N=20
# ---------------------------------------------------------------------------

# (key, fact, question, expected keyword)
_REPORT_FACTS = (
    ("name", "The user's name is Nadia.", "What is the user's name?", "Nadia"),
    ("home_city", "The user's home city is Lisbon.", "What is the user's home city?", "Lisbon"),
    ("employer", "The user's employer is Globex.", "Who is the user's employer?", "Globex"),
    ("dog_name", "The user's dog is named Biscuit.", "What is the user's dog named?", "Biscuit"),
    ("favourite_language", "The user's favourite programming language is Rust.",
     "What is the user's favourite programming language?", "Rust"),
    ("code_editor", "The user's code editor is Neovim.", "What is the user's code editor?", "Neovim"),
    ("project_database", "The user's project database is PostgreSQL.", "What is the user's project database?",
     "PostgreSQL"),
    ("favourite_colour", "The user's favourite colour is teal.", "What is the user's favourite colour?", "teal"),
    ("instrument", "The user plays the cello.", "What instrument does the user play?", "cello"),
    ("morning_drink", "The user's morning drink is cocoa.", "What is the user's morning drink?", "cocoa"),
)

# Each distractor shares a topic with one fact (same order) but answers no query.
_REPORT_DISTRACTORS = (
    ("manager", "The user's manager is named Tobias."),
    ("sister_city", "The user's sister lives in Oslo."),
    ("previous_employer", "The user's previous employer was Initech."),
    ("dog_bed", "The user's dog sleeps in the kitchen."),
    ("team_language", "The user's team also writes some Go."),
    ("colleague_editor", "The user's colleague prefers Emacs."),
    ("project_cache", "The user's project cache is Redis."),
    ("office_desk", "The user's office has a standing desk."),
    ("brother_instrument", "The user's brother plays the drums."),
    ("dislikes", "The user dislikes coffee."),
)

REPORT_ENTITY = "user/profile"


def report_session(n_facts: int = 10) -> Session:
    """The report's protocol. N=20 interleaves each distractor after its fact."""
    if n_facts not in (10, 20):
        raise ValueError("the report's session has n_facts 10 or 20")
    facts = [Fact(REPORT_ENTITY, key, text) for key, text, _, _ in _REPORT_FACTS]
    if n_facts == 20:
        distractors = [Fact(REPORT_ENTITY, key, text) for key, text in _REPORT_DISTRACTORS]
        facts = [f for pair in zip(facts, distractors) for f in pair]
    queries = [Query(q, kw, f"{REPORT_ENTITY}/{key}") for key, _, q, kw in _REPORT_FACTS]
    return Session(name=f"report_n{n_facts}", facts=tuple(facts), queries=tuple(queries))


# ---------------------------------------------------------------------------
# Generated sessions
# ---------------------------------------------------------------------------

_PEOPLE = ("Nadia", "Tobias", "Priya", "Mateo", "Yuki", "Amara", "Lars", "Ingrid", "Kofi", "Elena",
           "Rafael", "Leila", "Omar", "Hana", "Dmitri", "Sofia")

# key -> (fact template, question template, value pool)
_ATTRIBUTES = {
    "home_city": ("{p}'s home city is {v}.", "What is {p}'s home city?",
                  ("Lisbon", "Oslo", "Nairobi", "Quito", "Hanoi", "Tbilisi", "Kyoto", "Lima", "Dakar", "Perth",
                   "Bergen", "Zagreb", "Tallinn", "Valencia", "Accra", "Dublin")),
    "employer": ("{p}'s employer is {v}.", "Who is {p}'s employer?",
                 ("Globex", "Initech", "Umbrella", "Hooli", "Vandelay", "Soylent", "Wonka", "Tyrell",
                  "Cyberdyne", "Aperture", "Oscorp", "Dunder", "Stark", "Wayne", "Acme", "Monarch")),
    "dog_name": ("{p}'s dog is named {v}.", "What is {p}'s dog named?",
                 ("Biscuit", "Pepper", "Mochi", "Rocket", "Waffles", "Waldo", "Bruno", "Nugget", "Pickles",
                  "Marble", "Domino", "Truffle", "Noodle", "Gizmo", "Sherlock", "Barnaby")),
    "favourite_language": ("{p}'s favourite programming language is {v}.",
                           "What is {p}'s favourite programming language?",
                           ("Rust", "Haskell", "Kotlin", "Elixir", "Scala", "Julia", "Erlang", "Clojure", "OCaml",
                            "Swift", "Fortran", "Perl", "Zig", "Dart", "Lua", "Cobol")),
    "code_editor": ("{p}'s code editor is {v}.", "What is {p}'s code editor?",
                    ("Neovim", "Emacs", "Helix", "Zed", "Kakoune", "Sublime", "Geany", "Kate", "Notepad",
                     "Brackets", "Eclipse", "Xcode", "Fleet", "Lapce", "Micro", "Joe")),
    "project_database": ("{p}'s project database is {v}.", "What is {p}'s project database?",
                         ("PostgreSQL", "SQLite", "MongoDB", "Cassandra", "DynamoDB", "Neo4j", "CouchDB",
                          "MariaDB", "Firebird", "ClickHouse", "CockroachDB", "Couchbase", "InfluxDB",
                          "Oracle", "Spanner", "Riak")),
    "favourite_colour": ("{p}'s favourite colour is {v}.", "What is {p}'s favourite colour?",
                         ("teal", "crimson", "amber", "violet", "olive", "maroon", "indigo", "magenta",
                          "turquoise", "scarlet", "beige", "lavender", "ochre", "cyan", "mauve", "khaki")),
    "instrument": ("{p} plays the {v}.", "What instrument does {p} play?",
                   ("cello", "violin", "banjo", "trumpet", "harp", "oboe", "flute", "ukulele", "clarinet",
                    "accordion", "saxophone", "tuba", "bassoon", "mandolin", "sitar", "harmonica")),
    "morning_drink": ("{p}'s morning drink is {v}.", "What is {p}'s morning drink?",
                      ("cocoa", "espresso", "matcha", "kefir", "lemonade", "kombucha", "smoothie", "horchata",
                       "lassi", "yerba", "cider", "milkshake", "latte", "mocha", "rooibos", "ginger")),
    "favourite_fruit": ("{p}'s favourite fruit is {v}.", "What is {p}'s favourite fruit?",
                        ("mango", "papaya", "lychee", "guava", "plum", "apricot", "cherry", "fig", "melon",
                         "pear", "durian", "quince", "persimmon", "pomelo", "rambutan", "tangerine")),
    "car": ("{p} drives a {v}.", "What car does {p} drive?",
            ("Volvo", "Subaru", "Tesla", "Fiat", "Skoda", "Mazda", "Saab", "Lada", "Jeep", "Kia", "Dacia",
             "Seat", "Opel", "Lancia", "Rover", "Peugeot")),
    "sport": ("{p}'s sport is {v}.", "What is {p}'s sport?",
              ("tennis", "rowing", "fencing", "curling", "hockey", "cricket", "surfing", "karate", "judo",
               "archery", "squash", "badminton", "handball", "lacrosse", "polo", "climbing")),
    "api_port": ("{p}'s API server listens on port {v}.", "Which port does {p}'s API server listen on?", ()),
}


def _port_pool(rng: random.Random, n: int) -> list[str]:
    # Four-digit ports whose digits never contain one another as substrings.
    ports: list[str] = []
    while len(ports) < n:
        p = str(rng.randrange(2000, 9999))
        if all(p not in q and q not in p for q in ports):
            ports.append(p)
    return ports


def most_generated_facts(n_people: int) -> int:
    """How many facts ``n_people`` people of a generated session can hold: one per attribute each."""
    return n_people * len(_ATTRIBUTES)


def generated_session(seed: int, n_people: int = 6, n_facts: int = 60, n_queries: int | None = None) -> Session:
    """A reproducible larger session: ``n_facts`` facts about ``n_people`` people.

    Each person gets a random subset of attributes; every value is unique in
    the session and no value is a substring of another value, a name or a
    question, so a hit can only come from the right fact. ``n_queries``
    (default: all facts) queries are drawn without replacement, in random order.
    Facts are returned in write order: grouped by person, people and each
    person's attributes in random order.
    """
    attrs = list(_ATTRIBUTES)
    if not 1 <= n_people <= len(_PEOPLE):
        raise ValueError(f"n_people must be in 1..{len(_PEOPLE)}")
    if n_facts > most_generated_facts(n_people):
        raise ValueError(f"{n_people} people hold at most {most_generated_facts(n_people)} facts")
    rng = random.Random(seed)
    people = rng.sample(_PEOPLE, n_people)
    # Spread facts evenly: a round-robin over people, each drawing an attribute it does not have yet.
    remaining = {p: rng.sample(attrs, len(attrs)) for p in people}
    pairs: list[tuple[str, str]] = []
    while len(pairs) < n_facts:
        for p in people:
            if len(pairs) < n_facts and remaining[p]:
                pairs.append((p, remaining[p].pop()))
    per_attr: dict[str, list[str]] = {}
    for key in attrs:
        count = sum(1 for _, a in pairs if a == key)
        pool = _port_pool(rng, count) if key == "api_port" else rng.sample(_ATTRIBUTES[key][2], count)
        per_attr[key] = pool

    # Written one person at a time (people in random order, each one's attributes in random order), as a
    # conversation that turns from one person to the next. A weak reader with all 60 facts in its prompt
    # (mode D) finds a person's facts far better together than scattered: in a check on the earlier,
    # fully shuffled sessions, SmolLM2-135M answered 4/20 (seed 0) and 3/30 (seed 1) of the questions
    # with the facts shuffled and 8/20 and 14/30 with the same facts sorted by person.
    turn = {p: i for i, p in enumerate(rng.sample(people, len(people)))}
    pairs.sort(key=lambda pair: turn[pair[0]])  # stable: each person's attributes keep their random order

    facts, queries = [], []
    for person, key in pairs:
        fact_tpl, q_tpl, _ = _ATTRIBUTES[key]
        value = per_attr[key].pop()
        fact = Fact(f"people/{person.lower()}", key, fact_tpl.format(p=person, v=value))
        facts.append(fact)
        queries.append(Query(q_tpl.format(p=person), value, fact.path))
    # Distractors: the same attribute's answers for the other people in the session.
    by_key = {key: [q.expected for (_, k), q in zip(pairs, queries) if k == key] for key in attrs}
    queries = [Query(q.question, q.expected, q.fact_path, tuple(v for v in by_key[k] if v != q.expected))
               for (_, k), q in zip(pairs, queries)]
    _check_unambiguous(queries)
    rng.shuffle(queries)
    n_queries = len(queries) if n_queries is None else n_queries
    return Session(name=f"generated_s{seed}_n{n_facts}", facts=tuple(facts), queries=tuple(queries[:n_queries]))


def _check_unambiguous(queries: list[Query]) -> None:
    expected = [q.expected.lower() for q in queries]
    for q in queries:
        kw = q.expected.lower()
        clash = [e for e in expected if e != kw and (kw in e or e in kw)]
        if clash or kw in q.question.lower() or any(kw in p.lower() for p in _PEOPLE):
            raise AssertionError(f"ambiguous keyword {q.expected!r}: {clash}")


def check_seeds(seeds: list[int], split: str) -> None:
    """Refuse a seed outside ``split``'s range: a report never runs on a tuning seed, nor tuning on a reporting one."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {sorted(SPLITS)}, got {split!r}")
    allowed = SPLITS[split]
    wrong = [s for s in seeds if s not in allowed]
    if wrong:
        raise ValueError(f"seeds {wrong} are not {split} seeds; {split} seeds are {allowed.start}-{allowed.stop - 1} "
                         f"(reporting {REPORTING_SEEDS.start}-{REPORTING_SEEDS.stop - 1}, tuning "
                         f"{TUNING_SEEDS.start}-{TUNING_SEEDS.stop - 1})")
    if not seeds:
        raise ValueError(f"give at least one {split} seed")


# ---------------------------------------------------------------------------
# External sessions (--session-file)
# ---------------------------------------------------------------------------

class SessionFileError(ValueError):
    """A session file that cannot be run; the message names the file, the place and what to fix."""


def _field(obj: dict[str, Any], name: str, kind: type, where: str, *, required: bool = True) -> Any:
    if name not in obj:
        if required:
            raise SessionFileError(f"{where}: missing field {name!r}")
        return None
    value = obj[name]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise SessionFileError(f"{where}: {name!r} must be a {kind.__name__}, got {type(value).__name__}")
    if kind is str:
        if not value.strip():
            raise SessionFileError(f"{where}: {name!r} must not be empty")
        _check_text(value, f"{where}: {name!r}")
    return value


def _check_text(text: str, where: str) -> None:
    """Text the tokenizer and the store can take: a lone surrogate (JSON's "\\ud800") passed the file's checks and
    failed deep in a run (red-team finding, 0.7.10)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise SessionFileError(f"{where} holds a lone surrogate (an unpaired \\ud800-\\udfff escape); "
                               "write the character itself or a paired escape") from None


def parse_session(data: Any, source: str = "session") -> Session:
    """A ``Session`` from the session-file format; ``SessionFileError`` for any malformed part.

    Format: ``{"name", "facts": [{"entity_path", "key", "text"}], "queries": [{"question", "expected",
    "fact_path", "distractors": [...] (optional)}]}``; facts are written in the listed order and
    ``fact_path`` is ``entity_path/key`` of the fact that answers the question.
    """
    if not isinstance(data, dict):
        raise SessionFileError(f"{source}: the top level must be a JSON object with name, facts and queries, "
                               f"got {type(data).__name__}")
    _known_fields(data, ("name", "facts", "queries"), source)
    name = _field(data, "name", str, source)
    facts_raw = _field(data, "facts", list, source)
    queries_raw = _field(data, "queries", list, source)
    if not facts_raw:
        raise SessionFileError(f"{source}: 'facts' is empty; a session writes at least one fact")
    if not queries_raw:
        raise SessionFileError(f"{source}: 'queries' is empty; a session asks at least one question")
    facts: list[Fact] = []
    seen: dict[str, int] = {}
    for i, raw in enumerate(facts_raw):
        where = f"{source}: facts[{i}]"
        if not isinstance(raw, dict):
            raise SessionFileError(f"{where} must be an object with entity_path, key and text, got {type(raw).__name__}")
        _known_fields(raw, ("entity_path", "key", "text"), where)
        fact = Fact(_field(raw, "entity_path", str, where).strip().strip("/"), _field(raw, "key", str, where).strip(),
                    _field(raw, "text", str, where))
        if "/" in fact.key:
            raise SessionFileError(f"{where}: 'key' must not contain '/', got {fact.key!r} (put the path in entity_path)")
        try:  # the write rules, checked here so a bad file is refused before any model loads
            validate_entity_path(fact.entity_path)
            validate_key(fact.key)
        except ValidationError as error:
            raise SessionFileError(f"{where}: {error}") from None
        try:  # the value limit the write applies (AMFS_MAX_VALUE_BYTES' default)
            serialize_value(fact.text)
        except ValidationError as error:
            raise SessionFileError(f"{where}: 'text': {error}") from None
        if fact.path in seen:
            raise SessionFileError(f"{where}: duplicate key {fact.path!r} (also facts[{seen[fact.path]}]); "
                                   "each fact needs its own entity_path/key")
        seen[fact.path] = i
        facts.append(fact)
    queries: list[Query] = []
    asked: dict[str, int] = {}
    for i, raw in enumerate(queries_raw):
        where = f"{source}: queries[{i}]"
        if not isinstance(raw, dict):
            raise SessionFileError(f"{where} must be an object with question, expected and fact_path, "
                                   f"got {type(raw).__name__}")
        _known_fields(raw, ("question", "expected", "fact_path", "distractors"), where)
        question = _field(raw, "question", str, where)
        if len(question) > MAX_QUERY_CHARS:  # what amfs_answer and amfs_retrieve take, so both paths run alike
            raise SessionFileError(f"{where}: 'question' is {len(question)} characters; at most {MAX_QUERY_CHARS}")
        if question.strip() in asked:  # the report pairs the modes' answers question by question
            raise SessionFileError(f"{where}: the same question as queries[{asked[question.strip()]}]; "
                                   "each question must be asked once")
        asked[question.strip()] = i
        expected = _field(raw, "expected", str, where).strip()
        fact_path = _field(raw, "fact_path", str, where).strip().strip("/")
        if fact_path not in seen:
            raise SessionFileError(f"{where}: fact_path {fact_path!r} names no fact; it must be entity_path/key of "
                                   f"one of the facts (e.g. {facts[0].path!r})")
        gold = facts[seen[fact_path]]
        if not mentions(gold.text, expected):
            raise SessionFileError(f"{where}: expected {expected!r} is not a word of {fact_path}'s text, so no answer "
                                   "read from that fact could be scored a hit; give the answer as the fact says it")
        distractors = _field(raw, "distractors", list, where, required=False) or []
        for j, d in enumerate(distractors):
            if not isinstance(d, str) or not d.strip():
                raise SessionFileError(f"{where}: distractors[{j}] must be a non-empty string, got {d!r}")
            _check_text(d, f"{where}: distractors[{j}]")
            if mentions(d, expected) or mentions(expected, d):
                raise SessionFileError(f"{where}: distractor {d!r} names the expected answer {expected!r}; "
                                       "no answer could ever be a hit")
        queries.append(Query(question, expected, fact_path, tuple(d.strip() for d in distractors)))
    return Session(name=name.strip(), facts=tuple(facts), queries=tuple(queries))


def _known_fields(raw: dict[str, Any], known: tuple[str, ...], where: str) -> None:
    """Refuse a field the format does not have: a misspelt one ("distractor") was ignored and changed the score."""
    unknown = sorted(str(name) for name in raw if name not in known)
    if unknown:
        raise SessionFileError(f"{where}: unknown field(s) {unknown}; the fields are {list(known)}")


def load_session_file(path: str | Path) -> Session:
    """Read and check a session file (see ``parse_session``); errors name the file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise SessionFileError(f"{path}: cannot read the session file ({error.strerror or error})") from None
    except UnicodeDecodeError as error:
        raise SessionFileError(f"{path}: not UTF-8 text (byte {error.start}); save the session file as UTF-8") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise SessionFileError(f"{path}: not valid JSON ({error.msg} at line {error.lineno}, "
                               f"column {error.colno})") from None
    except RecursionError:
        raise SessionFileError(f"{path}: JSON nested too deeply to read; a session file is a few levels deep") from None
    except ValueError as error:  # e.g. an integer of more than 4,300 digits
        raise SessionFileError(f"{path}: cannot read the JSON ({error})") from None
    return parse_session(data, str(path))
