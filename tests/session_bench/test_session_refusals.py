"""What a session benchmark run does with answers that cannot run, and how it states rates against the reference.

A red-team pass (0.7.12) found that one refusal late in a run (a prompt past the model's context) ended the whole
run with an error, and nothing measured before it was reported or written; and that "vs O" exceeded 100%.
tiny-random-qwen2 reads 4,096 positions and its tokenizer reads about one character as one token, so the sessions
here are sized in characters.
"""

from __future__ import annotations

import json
import re

import pytest

from amfs_server.session_bench import session_bench as sb

# About 2,200 tokens each: beside a short question it fits, beside a 1,990-character question it does not.
DEPLOY_LOG = "The deploy log of Ana says " + "retry failed again " * 114
BUILD_LOG = "The build log of Bo says " + "cache missed again " * 114
LONG_QUESTION = ("Whose build log says cache missed again, " + "cache missed again, " * 97)[:1990] + "?"


@pytest.fixture(autouse=True)
def byte_tokenizer(tmp_path, monkeypatch):
    """tiny-random-qwen2 borrows SmolLM2's tokenizer when a converted SmolLM2 lies in the model cache; these sizes
    hold for its byte tokenizer only, so each test gets an empty cache of its own."""
    monkeypatch.setenv("AMFS_LM_CACHE_DIR", str(tmp_path / "lm-cache"))


def _session(tmp_path, queries, facts=None):
    path = tmp_path / "session.json"
    path.write_text(json.dumps({"name": "late", "facts": facts or [
        {"entity_path": "ops", "key": "deploy_log", "text": DEPLOY_LOG},
        {"entity_path": "ops", "key": "build_log", "text": BUILD_LOG},
        {"entity_path": "ops", "key": "owner", "text": "The build team is owned by Bo."},
    ], "queries": queries}))
    return path


def _args(tmp_path, session, *extra):
    return sb.parse_args(["--backbone", "tiny-random-qwen2", "--device", "cpu", "--session-file", str(session),
                          "--embedder", "none", "--max-new-tokens", "1", "--key-scales-beside", "none",
                          "--out", str(tmp_path / "out"), *extra])


QUERIES = [
    {"question": "Whose deploy log says retry failed again?", "expected": "Ana", "fact_path": "ops/deploy_log"},
    {"question": LONG_QUESTION, "expected": "Bo", "fact_path": "ops/owner"},
]


def test_a_question_refused_late_in_a_run_is_reported_and_what_was_measured_is_kept(tmp_path, one_thread, capsys):
    """The second question's retrieved memory does not fit beside it: the retrieval modes are refused there, after
    the first question was answered in every mode. The run used to end there with an error and write nothing."""
    args = _args(tmp_path, _session(tmp_path, QUERIES), "--top-k", "1",
                 "--modes", "B_ams_text,A_ams_prefix,O_gold_text")
    report = sb.run_benchmark(args)

    assert report["config"]["backbone"].endswith("-byte-tok")  # the sizes above are in bytes
    summary = report["summary"]
    for mode in ("B_ams_text", "A_ams_prefix"):
        assert (summary[mode]["n"], summary[mode]["refused"]) == (1, 1), mode
        assert summary[mode]["hit_rate"] == summary[mode]["hits"] / 1  # over the answered question only
    assert (summary[sb.ORACLE]["n"], summary[sb.ORACLE]["refused"]) == (2, 0)  # the gold fact fits beside it
    refused = report["refused"]
    assert [(r["query_index"], r["mode"]) for r in refused] == [(1, "B_ams_text"), (1, "A_ams_prefix")]
    assert all(r["session"] == "late" and r["question"] == LONG_QUESTION for r in refused)
    assert all("fits" in r["reason"] and "ops/build_log" in r["reason"] for r in refused)
    assert len(report["queries"]) == 4  # every answer given, none for the refused ones

    saved = json.loads((tmp_path / "out" / "report.json").read_text())
    assert saved["refused"] == refused and saved["summary"]["A_ams_prefix"]["refused"] == 1
    markdown = (tmp_path / "out" / "report.md").read_text()
    assert "## Refused: 2 answers, left out of every rate" in markdown
    assert "| late | queries[1] |" in markdown and "| B_ams_text |" in markdown
    assert "not counted as misses" in markdown
    progress = capsys.readouterr().err
    assert "A_ams_prefix    query 2/2 REFUSED" in progress


def test_a_full_history_or_gold_prompt_past_the_context_is_refused_before_any_question_runs(tmp_path, one_thread,
                                                                                            capsys):
    """D reads every fact and the reference the gold fact: their prompts are known before anything runs, so the
    run stops then, naming every question and mode, instead of after the first question's answers."""
    facts = [{"entity_path": "ops", "key": "deploy_log", "text": DEPLOY_LOG},
             {"entity_path": "ops", "key": "owner", "text": "The build team is owned by Bo."}]
    queries = [QUERIES[0], {"question": LONG_QUESTION, "expected": "Ana", "fact_path": "ops/deploy_log"}]
    args = _args(tmp_path, _session(tmp_path, queries, facts), "--modes", "D_full_history,A_ams_prefix,O_gold_text")
    with pytest.raises(SystemExit) as stopped:
        sb.run_benchmark(args)
    message = str(stopped.value)
    assert "late queries[1]: D_full_history needs 4" in message and "O_gold_text needs 4" in message
    assert "queries[0]" not in message  # both fit beside the short question
    assert "nothing has run" in message and "leave D_full_history out of --modes" in message
    assert "query 1/2" not in capsys.readouterr().err  # no answer was generated before the stop


def test_a_refusal_through_the_server_is_reported_and_the_run_finishes(tmp_path, one_thread):
    """Through the server a refused amfs_answer (here: no retrieved memory fits) ended the run in the same way."""
    args = _args(tmp_path, _session(tmp_path, QUERIES), "--top-k", "1", "--via-server", "--modes", "A_ams_prefix")
    report = sb.run_benchmark(args)
    assert (report["summary"]["A_ams_prefix"]["n"], report["summary"]["A_ams_prefix"]["refused"]) == (1, 1)
    [refused] = report["refused"]
    assert refused["query_index"] == 1 and refused["mode"] == "A_ams_prefix" and refused["served_by"] == "server"
    assert "fits" in refused["reason"]


def _result(mode, question, hit):
    return sb.QueryResult(mode=mode, session="s0", question=question, expected="x", answer="", hit=hit,
                          gold_retrieved=None, gold_rank=None, memories=[], input_tokens=1, prefix_tokens=0,
                          new_tokens=1, retrieve_ms=0.0, compile_ms=0.0, ttft_ms=1.0, generate_ms=1.0)


def _report(results, modes):
    summary = sb.summarize(results, modes)
    return {"title": "t", "command": "c", "summary": summary, "targets": sb.targets(summary, results),
            "sessions": [{"session": "s0", "n_facts": 5, "n_queries": 5, "write_ms": 1.0, "compile_ms_total": 0.0,
                          "memories_compiled": 0}],
            "config": {"backbone": "b", "device": "cpu", "dtype": "float32", "embedder": "none", "top_k": 3,
                       "max_new_tokens": 4, "torch_threads": 1}}


def test_no_rate_against_the_reference_exceeds_100_percent():
    """The reader given the gold fact alone misses q5, which A answers: "vs O" (A's rate over O's) read 125%."""
    results = [_result(sb.ORACLE, f"q{i}", i < 5) for i in range(1, 6)]
    results += [_result("A_ams_prefix", f"q{i}", True) for i in range(1, 6)]
    summary = sb.summarize(results, ["A_ams_prefix", sb.ORACLE])
    a = summary["A_ams_prefix"]
    assert "hit_rate_vs_oracle" not in a
    assert (a["hits_on_oracle_hits"], a["oracle_hits"], a["hit_rate_on_oracle_hits"]) == (4, 4, 1.0)
    assert a["hits_beyond_oracle"] == 1  # answered where the reference missed: it is no strict ceiling
    markdown = sb.markdown(_report(results, ["A_ams_prefix", sb.ORACLE]))
    assert max(int(p) for p in re.findall(r"(\d+)%", markdown)) <= 100
    assert "| 100% (4/4) | 1 |" in markdown and "beyond O" in markdown and "vs O" not in markdown


def test_memories_that_do_not_fit_are_left_out_and_named_alike_in_process_and_through_the_server(tmp_path, one_thread):
    """Both logs are retrieved for the short question but only one fits beside it: amfs_answer answers from the
    ones that fit, best first, and names the other; the benchmark's own path refused the whole answer instead."""
    session = _session(tmp_path, QUERIES[:1])
    rows = {}
    for path, extra in (("in-process", ()), ("server", ("--via-server",))):
        args = _args(tmp_path, session, "--modes", "B_ams_text,A_ams_prefix", *extra)
        args.out = tmp_path / path
        report = sb.run_benchmark(args)
        assert report["refused"] == [] and report["summary"]["A_ams_prefix"]["answers_with_memories_left_out"] == 1
        assert "B_ams_text: 1 answers read fewer than it was given" in (tmp_path / path / "report.md").read_text()
        rows[path] = [(q["mode"], q["memories"], q["left_out"]) for q in report["queries"]]
    assert rows["in-process"] == rows["server"]
    # The two logs match the question's words (no embedder here): the best is given, the other does not fit beside it.
    assert rows["in-process"][0] == ("B_ams_text", ["ops/deploy_log"], ["ops/build_log"])


def test_only_amfs_answers_context_refusals_pass_for_refused_answers_and_any_other_error_ends_the_run():
    """Review finding (0.7.13): every tool error through the server became a refused answer, left out of the rates,
    so a server fault could hide as a refusal."""
    from amfs_server.session_bench.session_bench import _CONTEXT_REFUSAL

    assert _CONTEXT_REFUSAL.search("mode='prefix' needs 9000 prompt tokens and up to 30 new ones; smollm2 reads at most 8192.")
    assert _CONTEXT_REFUSAL.search("None of the 3 retrieved memories fits smollm2's context beside the question and ...")
    assert not _CONTEXT_REFUSAL.search("Too many calls in progress for this API key; retry.")
    assert not _CONTEXT_REFUSAL.search("Internal error: KeyError('metrics')")


THREE_QUERIES = [
    {"question": "Whose deploy log says retry failed again?", "expected": "Ana", "fact_path": "ops/deploy_log"},
    {"question": "Whose build log says cache missed again?", "expected": "Bo", "fact_path": "ops/build_log"},
    {"question": "Who owns the build team?", "expected": "Bo", "fact_path": "ops/owner"},
]


def _interrupt_at(monkeypatch, call: int) -> None:
    """Ctrl-C (a KeyboardInterrupt) as the reader is asked for its `call`-th answer."""
    answer, calls = sb._answer_in_process, [0]

    def interrupted(*args, **kwargs):
        calls[0] += 1
        if calls[0] == call:
            raise KeyboardInterrupt
        return answer(*args, **kwargs)

    monkeypatch.setattr(sb, "_answer_in_process", interrupted)


def test_an_interrupted_run_writes_the_questions_asked_in_every_mode_and_exits_130(tmp_path, one_thread, monkeypatch,
                                                                                 capsys):
    """Ctrl-C in the second question's second mode: the first question, asked in both modes, is reported; the
    second's half-asked answers are not, so both rates cover the same question. It used to write nothing."""
    _interrupt_at(monkeypatch, 4)
    session = _session(tmp_path, THREE_QUERIES)
    with pytest.raises(SystemExit) as ended:
        sb.main(["--backbone", "tiny-random-qwen2", "--device", "cpu", "--session-file", str(session),
                 "--embedder", "none", "--max-new-tokens", "1", "--key-scales-beside", "none",
                 "--modes", "B_ams_text,O_gold_text", "--out", str(tmp_path / "out")])
    assert ended.value.code == 130
    written = json.loads((tmp_path / "out" / "report.json").read_text())
    assert written["interrupted"].startswith("interrupted after 1 of 3 questions (1 of 1 sessions begun)")
    assert {mode: written["summary"][mode]["n"] for mode in ("B_ams_text", sb.ORACLE)} == {"B_ams_text": 1,
                                                                                            sb.ORACLE: 1}
    assert [q["question"] for q in written["queries"]] == [THREE_QUERIES[0]["question"]] * 2
    assert written["sessions"][0]["queries_done"] == 1
    assert "**Partial report: interrupted after 1 of 3 questions" in (tmp_path / "out" / "report.md").read_text()
    assert "writing what was answered" in capsys.readouterr().err


def test_a_run_interrupted_before_any_question_was_asked_in_every_mode_writes_nothing(tmp_path, one_thread,
                                                                                     monkeypatch):
    _interrupt_at(monkeypatch, 2)
    args = _args(tmp_path, _session(tmp_path, THREE_QUERIES), "--modes", "B_ams_text,O_gold_text")
    with pytest.raises(KeyboardInterrupt):
        sb.run_benchmark(args)
    assert not (tmp_path / "out").exists()
