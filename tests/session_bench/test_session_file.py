"""External sessions (--session-file) and the tuning/reporting seed split."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from amfs_server.session_bench import session_bench as sb
from amfs_server.session_bench.session_data import (REPORTING_SEEDS, TUNING_SEEDS, SessionFileError, check_seeds,
                                                    load_session_file, parse_session)

EXAMPLE = Path(sb.__file__).parent / "data" / "example_session.json"


def _good() -> dict:
    return json.loads(EXAMPLE.read_text())


def test_the_committed_example_session_loads_in_order_with_distractors():
    session = load_session_file(EXAMPLE)
    raw = _good()
    assert session.name == raw["name"]
    assert [f.path for f in session.facts] == [f"{f['entity_path']}/{f['key']}" for f in raw["facts"]]
    assert [q.question for q in session.queries] == [q["question"] for q in raw["queries"]]
    assert session.queries[0].distractors == ("Ljubljana",)
    assert session.queries[-1].distractors == ()  # optional
    for q in session.queries:
        assert q.hit(session.fact(q.fact_path).text)


def _broken(change) -> dict:
    data = copy.deepcopy(_good())
    change(data)
    return data


MALFORMED = {
    "top level not an object": ([1, 2], "top level must be a JSON object"),
    "missing name": (_broken(lambda d: d.pop("name")), "missing field 'name'"),
    "missing facts": (_broken(lambda d: d.pop("facts")), "missing field 'facts'"),
    "missing queries": (_broken(lambda d: d.pop("queries")), "missing field 'queries'"),
    "empty facts": (_broken(lambda d: d.update(facts=[])), "'facts' is empty"),
    "empty queries": (_broken(lambda d: d.update(queries=[])), "'queries' is empty"),
    "facts not a list": (_broken(lambda d: d.update(facts={"a": 1})), "'facts' must be a list"),
    "name not a string": (_broken(lambda d: d.update(name=3)), "'name' must be a str"),
    "empty name": (_broken(lambda d: d.update(name="  ")), "'name' must not be empty"),
    "fact not an object": (_broken(lambda d: d["facts"].append("text")), "facts[6] must be an object"),
    "fact missing text": (_broken(lambda d: d["facts"][1].pop("text")), "facts[1]: missing field 'text'"),
    "fact key wrong type": (_broken(lambda d: d["facts"][2].update(key=7)), "facts[2]: 'key' must be a str"),
    "fact key with a slash": (_broken(lambda d: d["facts"][2].update(key="a/b")), "must not contain '/'"),
    "entity path with ..": (_broken(lambda d: d["facts"][2].update(entity_path="services/../etc")),
                            "facts[2]: entity_path 'services/../etc' contains '..'"),
    "key with a space": (_broken(lambda d: d["facts"][2].update(key="a b")), "facts[2]: key 'a b' has an invalid"),
    "duplicate key": (_broken(lambda d: d["facts"].append(dict(d["facts"][0]))),
                      "facts[6]: duplicate key 'services/billing/database' (also facts[0])"),
    "query missing expected": (_broken(lambda d: d["queries"][0].pop("expected")),
                               "queries[0]: missing field 'expected'"),
    "query question wrong type": (_broken(lambda d: d["queries"][1].update(question=["?"])),
                                  "queries[1]: 'question' must be a str"),
    "fact_path names no fact": (_broken(lambda d: d["queries"][2].update(fact_path="services/billing/colour")),
                                "queries[2]: fact_path 'services/billing/colour' names no fact"),
    "distractors not a list": (_broken(lambda d: d["queries"][0].update(distractors="Ljubljana")),
                               "'distractors' must be a list"),
    "distractor not a string": (_broken(lambda d: d["queries"][0].update(distractors=[3])),
                                "distractors[0] must be a non-empty string"),
    "distractor is the answer": (_broken(lambda d: d["queries"][0].update(distractors=["porto"])),
                                 "names the expected answer"),
    # Found by a red-team pass (0.7.10): each passed the checks and failed after the model had loaded.
    "lone surrogate in a fact": (_broken(lambda d: d["facts"][1].update(text="caf\ud800")),
                                 "facts[1]: 'text' holds a lone surrogate"),
    "lone surrogate in a question": (_broken(lambda d: d["queries"][1].update(question="where\udc00?")),
                                     "queries[1]: 'question' holds a lone surrogate"),
    "fact over the value limit": (_broken(lambda d: d["facts"][1].update(text="x" * 1_100_000)),
                                  "facts[1]: 'text': value is"),
    "question over 2,000 characters": (_broken(lambda d: d["queries"][1].update(question="why " * 600)),
                                       "queries[1]: 'question' is 2400 characters; at most 2000"),
    "the same question twice": (_broken(lambda d: d["queries"].append(dict(d["queries"][0], expected="x"))),
                                "the same question as queries[0]"),
    # Found by a red-team pass (0.7.12): each was taken and changed the score without a word.
    "a misspelt field": (_broken(lambda d: d["queries"][0].update(distractor=["Ljubljana"])),
                         "queries[0]: unknown field(s) ['distractor']"),
    "an unknown field at the top": (_broken(lambda d: d.update(notes="x")), "unknown field(s) ['notes']"),
    "an unknown fact field": (_broken(lambda d: d["facts"][0].update(value="x")), "facts[0]: unknown field(s) ['value']"),
    "an answer its fact does not say": (_broken(lambda d: d["queries"][0].update(expected="Lisbon")),
                                        "queries[0]: expected 'Lisbon' is not a word of services/billing/office's text"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_every_malformed_session_is_refused_with_a_message_naming_the_place(case, tmp_path):
    data, message = MALFORMED[case]
    path = tmp_path / "s.json"
    path.write_text(json.dumps(data))
    with pytest.raises(SessionFileError) as error:
        load_session_file(path)
    assert message in str(error.value) and str(path) in str(error.value)


def test_unreadable_and_invalid_json_files_are_clear_errors(tmp_path):
    with pytest.raises(SessionFileError, match="cannot read the session file"):
        load_session_file(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"name": "x",')
    with pytest.raises(SessionFileError, match=r"not valid JSON .* line 1"):
        load_session_file(bad)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)  # valid JSON; json.loads used to die with a RecursionError
    with pytest.raises(SessionFileError, match="nested too deeply"):
        load_session_file(deep)
    latin1 = tmp_path / "latin1.json"
    latin1.write_bytes('{"name": "caf\u00e9"}'.encode("latin-1"))
    with pytest.raises(SessionFileError, match="not UTF-8 text"):
        load_session_file(latin1)
    huge = tmp_path / "huge.json"
    huge.write_text('{"name": ' + "9" * 5000 + "}")
    with pytest.raises(SessionFileError, match="cannot read the JSON"):
        load_session_file(huge)
    assert isinstance(SessionFileError("x"), ValueError)
    with pytest.raises(SessionFileError):
        parse_session({"name": "x", "facts": [], "queries": []})


def test_bench_runs_every_mode_on_a_session_file(tmp_path, capsys):
    from tests.session_bench.test_session_runner import BagOfWordsEmbedder

    out = tmp_path / "r"
    args = sb.parse_args(["--backbone", "tiny-random-qwen2", "--device", "cpu", "--session-file", str(EXAMPLE),
                          "--max-new-tokens", "2", "--embedder", "none", "--out", str(out)])
    report = sb.run_benchmark(args, embedder=BagOfWordsEmbedder())
    assert report["sessions"][0]["session"] == "example_services" and report["sessions"][0]["n_facts"] == 6
    assert all(s["n"] == 4 for s in report["summary"].values())
    assert "external session file" in (out / "report.md").read_text()
    distractors = {q["question"]: q["distractors"] for q in report["queries"]}
    assert distractors["Where does the billing team work from?"] == ["Ljubljana"]


def test_a_malformed_session_file_stops_the_bench_with_the_loader_message(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"name": "x", "facts": [], "queries": []}))
    args = sb.parse_args(["--backbone", "tiny-random-qwen2", "--device", "cpu", "--session-file", str(path),
                          "--embedder", "none", "--out", str(tmp_path / "r")])
    with pytest.raises(SystemExit, match="'facts' is empty"):
        sb.run_benchmark(args, loaded=(None, None, None))


def test_the_session_file_is_checked_before_any_model_loads(tmp_path):
    """A red-team finding: the backbone and embedder loaded first (25 s), and only then was the file refused; with a
    backbone that does not exist the file's own error was never seen."""
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"name": "x", "facts": [], "queries": []}))
    args = sb.parse_args(["--backbone", str(tmp_path / "no-such-model"), "--device", "cpu", "--session-file",
                          str(path), "--embedder", "none", "--out", str(tmp_path / "r")])
    with pytest.raises(SystemExit, match="'facts' is empty"):
        sb.run_benchmark(args)  # no `loaded`: the load would fail on the missing backbone first
    many = _good()
    many["facts"] += [{"entity_path": "bulk", "key": f"k{n}", "text": f"note {n}"} for n in range(520)]
    path.write_text(json.dumps(many))
    through_server = sb.parse_args(["--backbone", str(tmp_path / "no-such-model"), "--device", "cpu", "--via-server",
                                    "--session-file", str(path), "--embedder", "none", "--out", str(tmp_path / "r")])
    with pytest.raises(SystemExit, match="526 facts; through the server, mode D"):
        sb.run_benchmark(through_server)


def test_seed_ranges_are_disjoint_and_each_split_refuses_the_others_seeds():
    assert not set(REPORTING_SEEDS) & set(TUNING_SEEDS)
    check_seeds([0, 5, 99], "report")
    check_seeds([100, 150], "tuning")
    with pytest.raises(ValueError, match=r"seeds \[100\] are not report seeds"):
        check_seeds([0, 100], "report")
    with pytest.raises(ValueError, match=r"seeds \[3\] are not tuning seeds"):
        check_seeds([3], "tuning")


def test_no_report_run_reads_a_tuning_seed_session(tmp_path, capsys, monkeypatch):
    read = []
    real = sb.generated_session
    monkeypatch.setattr(sb, "generated_session", lambda seed, **kw: read.append(seed) or real(seed, **kw))
    with pytest.raises(SystemExit):
        sb.parse_args(["--large", "--seeds", "0,100"])
    assert "not report seeds" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        sb.parse_args(["--large", "--split", "tuning", "--seeds", "1"])
    assert "not tuning seeds" in capsys.readouterr().err
    # The default report seed is a reporting seed, the default tuning seed a tuning one.
    assert sb.parse_args(["--large"]).seed_list == [REPORTING_SEEDS.start]
    assert sb.parse_args(["--large", "--split", "tuning"]).seed_list == [TUNING_SEEDS.start]
    # Arguments built past parse_args are checked again before any session is generated.
    args = sb.parse_args(["--large", "--embedder", "none", "--out", str(tmp_path)])
    args.seed_list = [100]
    with pytest.raises(ValueError, match="not report seeds"):
        sb.run_benchmark(args, loaded=(None, None, None))
    assert read == []


def test_an_answer_in_a_script_without_spaces_is_found_as_text():
    from amfs_server.session_bench.session_data import mentions

    assert mentions("工程师是王小明。", "王小明") and mentions("東京都に住んでいます", "東京")
    assert mentions("The owner is Teodor.", "teodor") and not mentions("Teodora owns it.", "Teodor")


@pytest.mark.parametrize("flag, value, message", [
    ("--max-new-tokens", "0", "--max-new-tokens must be in 1..1024"),
    ("--max-new-tokens", "2000", "--max-new-tokens must be in 1..1024"),
    ("--key-scale", "nan", "--key-scale must be in (0, 4]"),
    ("--key-scale", "-5", "--key-scale must be in (0, 4]"),
    ("--top-k", "60", "--top-k must be in 1..50"),
])
def test_settings_outside_what_amfs_answer_takes_are_refused_before_anything_loads(flag, value, message, capsys):
    with pytest.raises(SystemExit):
        sb.parse_args([flag, value])
    assert message in capsys.readouterr().err


def test_through_the_server_more_than_500_facts_are_refused_only_with_mode_d(tmp_path):
    data = _good()
    data["facts"] += [{"entity_path": "bulk", "key": f"k{i}", "text": f"Bulk fact {i}."} for i in range(500)]
    path = tmp_path / "many.json"
    path.write_text(json.dumps(data))
    with pytest.raises(SystemExit, match="Leave D_full_history out of --modes"):
        sb._session_file(sb.parse_args(["--session-file", str(path), "--via-server"]))
    args = sb.parse_args(["--session-file", str(path), "--via-server", "--modes", "A_ams_prefix,B_ams_text"])
    assert len(sb._session_file(args).facts) == 506


def test_an_arabic_answer_with_an_attached_proclitic_is_a_hit_and_another_word_is_not():
    """Arabic writes و ف (and, so), ب ك ل (in, like, for) and the article ال onto the next word: "بالقاهرة" (in Cairo)
    names "القاهرة" but was scored a miss (red-team finding, 0.7.12). Only that chain may come before the word."""
    from amfs_server.session_bench.session_data import Query, mentions

    cairo = Query("أين يعمل الفريق؟", "القاهرة", "team/office", distractors=("الإسكندرية",))
    for answer in ("القاهرة", "يعمل الفريق بالقاهرة.", "والقاهرة", "وبالقاهرة", "كالقاهرة",
                   "للقاهرة",  # ل + ال is written لل
                   "فللقاهرة", "القاهرةُ"):  # a vowel mark after the word is not a letter
        assert cairo.hit(answer) and cairo.hit_lenient(answer), answer
    for answer in ("القاهرية", "مالقاهرة", "لالقاهرة", "قاهرة",  # the word has the article: the answer needs it
                   "بالقاهرة والإسكندرية", "في بالإسكندرية"):
        assert not cairo.hit(answer), answer
    assert mentions("يعيش في بمصر", "مصر") and mentions("ومصر", "مصر") and mentions("المصر", "مصر")
    assert not mentions("المعلم", "علم") and not mentions("معلم", "علم")  # "teacher" holds "flag"'s letters
    assert not mentions("bPorto", "Porto") and not mentions("بPorto", "Porto")  # Arabic script only


def test_a_session_file_whose_arabic_fact_attaches_a_proclitic_to_the_answer_loads():
    data = {"name": "ar", "facts": [{"entity_path": "team", "key": "office", "text": "يعمل الفريق بالقاهرة."}],
            "queries": [{"question": "أين يعمل الفريق؟", "expected": "القاهرة", "fact_path": "team/office",
                         "distractors": ["الإسكندرية"]}]}
    assert parse_session(data).queries[0].expected == "القاهرة"
    data["queries"][0]["distractors"] = ["بالقاهرة"]
    with pytest.raises(SessionFileError, match="names the expected answer"):
        parse_session(data)
