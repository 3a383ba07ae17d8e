"""Session fact sets: the report's N=10/N=20 protocol and the generated larger sessions."""

from __future__ import annotations

import pytest

from amfs_server.session_bench.session_data import Query, generated_session, report_session


def test_report_session_shapes():
    n10, n20 = report_session(10), report_session(20)
    assert len(n10.facts) == 10 and len(n20.facts) == 20
    assert n10.queries == n20.queries and len(n10.queries) == 10
    paths = {f.path for f in n20.facts}
    assert len(paths) == 20
    for q in n20.queries:
        assert q.fact_path in paths
        assert q.hit(n20.fact(q.fact_path).text)  # the gold fact contains its keyword
        assert sum(q.hit(f.text) for f in n20.facts) == 1  # and no distractor does
    with pytest.raises(ValueError):
        report_session(15)


def test_hit_is_a_case_insensitive_whole_word():
    q = Query("What is the user's project database?", "PostgreSQL", "user/profile/project_database")
    assert q.hit("It is postgresql.")
    assert not q.hit("MySQL")


def test_strict_hit_refuses_a_longer_name_that_the_lenient_rule_accepts():
    q = Query("Who owns billing?", "Teodor", "services/billing/owner")
    assert not q.hit("Teodora owns it.") and q.hit_lenient("Teodora owns it.")
    assert q.hit("Teodor owns it.") and q.hit("It's TEODOR's.")


def test_strict_hit_is_a_miss_when_the_answer_also_names_a_distractor():
    q = Query("Where does the billing team work?", "Porto", "services/billing/office", ("Ljubljana",))
    both = "the office in Porto ... the office in Ljubljana"
    assert not q.hit(both) and q.hit_lenient(both)
    assert q.hit("The office in Porto.")
    assert not q.hit("Ljubljana")


def test_generated_queries_name_the_same_attribute_of_the_other_people_as_distractors():
    s = generated_session(0)
    for q in s.queries:
        key = q.fact_path.rsplit("/", 1)[1]
        others = {s.fact(f.path).text for f in s.facts if f.key == key and f.path != q.fact_path}
        assert len(q.distractors) == len(others) and q.expected not in q.distractors
        for d in q.distractors:  # each distractor is the answer of one of those facts
            assert sum(d in text for text in others) == 1


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_generated_session_is_reproducible_and_unambiguous(seed):
    s = generated_session(seed)
    assert s == generated_session(seed)
    assert len(s.facts) == 60 and len(s.queries) == 60
    assert len({f.path for f in s.facts}) == 60
    for q in s.queries:
        assert sum(q.hit(f.text) for f in s.facts) == 1
        assert q.hit(s.fact(q.fact_path).text)
        assert not q.hit(q.question)
    assert generated_session(seed + 100) != s


def test_generated_session_writes_one_person_at_a_time():
    s = generated_session(0)
    people = [f.entity_path for f in s.facts]
    turns = [p for i, p in enumerate(people) if i == 0 or p != people[i - 1]]
    assert len(turns) == len(set(turns)) == 6  # each person's facts are contiguous
    assert [f.key for f in s.facts[:10]] != sorted(f.key for f in s.facts[:10])  # attributes in random order


def test_generated_session_sizes():
    s = generated_session(5, n_people=8, n_facts=80, n_queries=50)
    assert len(s.facts) == 80 and len(s.queries) == 50
    with pytest.raises(ValueError):
        generated_session(0, n_people=2, n_facts=100)
