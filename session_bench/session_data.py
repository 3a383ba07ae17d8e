"""Session fact sets and the prompt wording the session benchmark asks with.

This module owns the benchmark's *data*: the facts a session writes as
memories, the targeted-recall queries with their expected keywords, the hit
rule, and the prompt wording (system prompt + user template) that every mode
shares. It holds no model code.

Two kinds of session:

* ``report_session(10 | 20)``: the report's protocol, 10 identity facts about
  the user and the same 10 queries; N=20 adds 10 distractors that share topics
  and wording with the facts (the user's sister's city, a previous employer, a
  colleague's editor) without answering any query.
* ``generated_session(seed)``: a larger session (60 facts, 60 queries by
  default) about several people, generated from attribute templates, so that
  every query has distractors of the same attribute for other people and
  differences between modes are not one query wide. Facts are written one
  person at a time.

Designed for a weak reader (SmolLM2-135M): short facts phrased like their
questions ("The user's code editor is Neovim." / "What is the user's code
editor?"), single-word answers that no other fact or answer contains, and a
system prompt asking for a few words from the notes. With all ten facts in the
prompt (mode D) SmolLM2 answers 10/10 at N=10 and N=20, so the ceiling is real
and every other mode is judged against it. On the generated 60-fact sessions it
is not (32% over three seeds): there the benchmark's reference, the gold fact
alone as text (89%), is the reader's ceiling.
"""

from __future__ import annotations

import random
from dataclasses import dataclass



@dataclass(frozen=True)
class Fact:
    """One memory the session writes: ``entity_path``/``key`` -> ``text``."""

    entity_path: str
    key: str
    text: str

    @property
    def path(self) -> str:
        return f"{self.entity_path}/{self.key}"


@dataclass(frozen=True)
class Query:
    """A targeted-recall question; ``fact_path`` names the fact that answers it."""

    question: str
    expected: str
    fact_path: str

    def hit(self, answer: str) -> bool:
        """The report's rule: the expected keyword appears in the answer, case-insensitive."""
        return self.expected.lower() in answer.lower()


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
    if n_facts > n_people * len(attrs):
        raise ValueError(f"{n_people} people hold at most {n_people * len(attrs)} facts")
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
