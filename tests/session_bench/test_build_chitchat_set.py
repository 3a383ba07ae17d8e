"""scripts/build_chitchat_set.py's cutting rules, on a small corpus in the Chit-Chat dataset's shape."""

from __future__ import annotations

from pathlib import Path

from .scripts_dir import script

builder = script("build_chitchat_set")


def _session(first: str, second: str, start: str, turns: int) -> dict:
    """A corpus conversation: `turns` runs alternating between two senders, each run of two messages."""
    runs = []
    for t in range(turns):
        sender = first if t % 2 == 0 else second
        runs.append([{"text": f"  word{t}  a\n", "timestamp": start, "sender": sender},
                     {"text": "b", "timestamp": start, "sender": sender}])
    return {"messages": runs}


def test_pairs_are_cut_to_their_sessions_turn_caps_and_utah_dates(monkeypatch) -> None:
    monkeypatch.setattr(builder, "MIN_SESSIONS", 3)
    monkeypatch.setattr(builder, "MIN_TURNS", 10)
    monkeypatch.setattr(builder, "MAX_TURNS", 100)
    monkeypatch.setattr(builder, "MAX_SESSION_TURNS", 5)
    corpus = {
        # a pair with three sessions; the second is too short and dropped, so it has two and is not taken
        "a1": _session("u1", "u2", "2018-04-01T10:00:00Z", 6),
        "a2": _session("u2", "u1", "2018-04-02T10:00:00Z", 3),
        "a3": _session("u1", "u2", "2018-04-03T10:00:00Z", 6),
        # a pair with four sessions of 8 turns, each cut to 5: 20 turns; 03:00 UTC is the day before in Utah
        **{f"b{i}": _session("v2" if i == 0 else "v1", "v1" if i == 0 else "v2", f"2018-05-0{i + 1}T03:00:00Z", 8)
           for i in range(4)},
        # three people in every session: not a pair, though its sessions would qualify
        **{f"c{i}": {"messages": [[{"text": f"x{t}", "timestamp": f"2018-06-0{i + 1}T10:00:00Z", "sender": "pqr"[t % 3]}]
                                  for t in range(6)]} for i in range(4)},
        # a pair with three sessions of 5 turns, earlier than the pair above: second, with fewer sessions
        **{f"d{i}": _session("w1", "w2", f"2018-03-0{i + 1}T18:00:00Z", 5) for i in range(3)},
    }
    built = builder.build(corpus)
    assert [(c["conversation_id"], c["split"], c["speakers"], len(c["sessions"])) for c in built] == [
        ("chit-01", "tuning", ["Alex", "Sam"], 4), ("chit-02", "test", ["Jordan", "Casey"], 3)]
    chat = built[0]
    assert [s["date"] for s in chat["sessions"]] == ["2018-04-30", "2018-05-01", "2018-05-02", "2018-05-03"]
    first = chat["sessions"][0]["turns"]
    assert [t["key"] for t in first] == ["D1:1", "D1:2", "D1:3", "D1:4", "D1:5"]
    # the first sender of the first session is named first, whoever it is in later sessions
    assert [t["speaker"] for t in first[:2]] == ["Alex", "Sam"]
    assert chat["sessions"][1]["turns"][0]["speaker"] == "Sam"
    assert first[0]["text"] == "word0 a b" and first[0]["date"] == "2018-04-30"


def test_a_long_pair_keeps_evenly_spaced_sessions_with_its_first_and_last() -> None:
    sessions = [[("s", f"t{i}", "")] * size for i, size in enumerate([10, 10, 10, 10, 10])]
    kept = builder._spread(sessions, 30)
    assert [s[0][1] for s in kept] == ["t0", "t2", "t4"]


def test_the_committed_chitchat_set_is_what_the_script_cuts_from_the_corpus() -> None:
    import json

    committed = json.loads((Path(__file__).resolve().parents[2] / "session_bench" / "data"
                            / "conversations_chitchat.json").read_text())["conversations"]
    cut = builder.build(builder.installed_corpus())
    assert [{k: v for k, v in c.items() if k != "questions"} for c in committed] == cut
