"""Pattern detection on interaction lists: recurring parameters, workflows, times of day (pure, no store)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from amfs_server.core.learning import Interaction
from amfs_server.core.patterns import PatternOptions, detect_patterns, tool_runs, wilson_lower_bound

START = datetime(2026, 3, 2, 9, 0, tzinfo=timezone.utc)
GITHUB = ["github_create_issue", "github_add_labels", "github_assign"]


def call(tool: str, at: datetime, session: str = "s1", **parameters: Any) -> Interaction:
    return Interaction(f"{tool}-{at.timestamp()}", "u", session, tool, "reported", parameters, None, {}, None, at)


def by_type(interactions: list[Interaction], kind: str) -> list:
    return [p for p in detect_patterns(interactions) if p.pattern_type == kind]


def test_wilson_lower_bound_grows_with_evidence() -> None:
    assert wilson_lower_bound(0, 0) == 0.0
    assert wilson_lower_bound(3, 3) == pytest.approx(0.75)
    assert wilson_lower_bound(3, 3) < wilson_lower_bound(10, 10) < wilson_lower_bound(50, 50) < 1
    assert wilson_lower_bound(45, 50) == pytest.approx(0.85, abs=0.01)


def test_three_identical_fetch_users_calls_within_minutes_are_a_recurring_parameter() -> None:
    calls = [call("fetch_users", START + timedelta(minutes=5 * n), limit=100) for n in range(3)]
    (pattern,) = by_type(calls, "recurring_parameter")
    assert pattern.tool_name == "fetch_users"
    assert pattern.data == {"tool": "fetch_users", "parameter": "limit", "value": 100, "matches": 3, "calls": 3}
    assert pattern.frequency == 1.0 and pattern.confidence == pytest.approx(0.75)
    assert by_type(calls[:2], "recurring_parameter") == []  # two calls are not yet a pattern


def test_a_value_in_a_minority_of_calls_or_a_redacted_one_is_not_a_recurring_parameter() -> None:
    mixed = [call("fetch_users", START + timedelta(minutes=n), limit=100 if n < 3 else n) for n in range(8)]
    assert by_type(mixed, "recurring_parameter") == []
    redacted = [call("login", START + timedelta(minutes=n), password="[REDACTED]") for n in range(5)]
    assert by_type(redacted, "recurring_parameter") == []


def github_days(days: int, extra_session_calls: list[str] | None = None) -> list[Interaction]:
    calls = []
    for day in range(days):
        at = START + timedelta(days=day)
        for step, tool in enumerate(GITHUB + (extra_session_calls or [])):
            calls.append(call(tool, at + timedelta(minutes=step), session=f"day-{day}"))
    return calls


def test_the_github_issue_workflow_is_detected_after_three_sessions() -> None:
    assert by_type(github_days(2), "workflow") == []
    workflows = {tuple(p.data["tools"]): p for p in by_type(github_days(3), "workflow")}
    assert tuple(GITHUB) in workflows
    pattern = workflows[tuple(GITHUB)]
    assert pattern.tool_name == "github_create_issue" and pattern.occurrences == 3 and pattern.frequency == 1.0
    assert [step["tool"] for step in pattern.data["steps"]] == GITHUB[1:]


def test_a_workflow_survives_noise_but_not_a_gap_longer_than_the_session_window() -> None:
    calls = github_days(4)
    calls.append(call("github_create_issue", START + timedelta(days=9), session="day-9"))  # once without follow-up
    (pattern,) = [p for p in by_type(calls, "workflow") if p.tool_name == "github_create_issue"]
    assert pattern.occurrences == 4 and pattern.frequency == pytest.approx(0.8)
    split = [call(tool, START + timedelta(days=d, hours=2 * i), session=f"d{d}") for d in range(3) for i, tool in enumerate(GITHUB)]
    assert by_type(split, "workflow") == []
    assert tool_runs(split, PatternOptions().workflow_gap)[0] == ["github_create_issue"]


def test_repeated_calls_in_a_row_count_once_in_a_workflow() -> None:
    calls = []
    for day in range(3):
        at = START + timedelta(days=day)
        for step, tool in enumerate(["github_create_issue", "github_add_labels", "github_add_labels", "github_assign"]):
            calls.append(call(tool, at + timedelta(minutes=step), session=f"day-{day}"))
    assert any(p.data["tools"] == GITHUB for p in by_type(calls, "workflow"))


def test_a_tool_used_in_the_same_hour_on_most_days_is_a_time_of_day_pattern() -> None:
    calls = [call("daily_sync", START + timedelta(days=d, minutes=d), session=f"d{d}") for d in range(4)]
    calls.append(call("daily_sync", START + timedelta(days=4, hours=6), session="late"))
    (pattern,) = by_type(calls, "time_of_day")
    assert pattern.data["hour"] == 9 and pattern.data["days"] == 4 and pattern.data["active_days"] == 5
    assert pattern.frequency == pytest.approx(0.8)
    shifted = detect_patterns(calls, PatternOptions(timezone="America/New_York"))
    assert [p.data["hour"] for p in shifted if p.pattern_type == "time_of_day"] == [4]


def test_workflows_from_a_position_index_are_the_chains_each_anchor_scan_finds() -> None:
    """0.7.10 indexes where each tool occurs once instead of scanning every run per tool (quadratic: 833 tools in
    10,000 calls took 1.6 s on the event loop); the chains found must not change."""
    import random

    from amfs_server.core.patterns import workflow_chain, workflows

    rng = random.Random(5)
    tools = [f"tool_{n}" for n in range(12)]
    calls = []
    for session in range(30):
        at = START + timedelta(days=session)
        for step in range(rng.randint(3, 12)):
            tool = tools[(session + step) % 5] if rng.random() < 0.7 else rng.choice(tools)
            calls.append(call(tool, at + timedelta(minutes=step), session=f"s{session}"))
    options = PatternOptions()
    runs = tool_runs(sorted(calls, key=lambda c: c.at), options.workflow_gap)
    scanned = [c for anchor in sorted({t for run in runs for t in run})
               if (c := workflow_chain(runs, anchor, options)) is not None]
    found = workflows(calls, options)
    assert found and sorted(found, key=lambda p: p.signature) == sorted(scanned, key=lambda p: p.signature)


def test_a_workflow_is_left_out_when_a_longer_one_of_its_user_ends_with_it_and_is_seen_as_often() -> None:
    from amfs_server.core.learning import Pattern, _without_redundant_workflows

    def workflow(user: str, tools: list[str], occurrences: int) -> Pattern:
        return Pattern(f"{user}-{'-'.join(tools)}", user, "workflow", tools[0], {"tools": tools}, occurrences,
                       0.5, 0.5, START, START)

    long = workflow("u", ["a", "b", "c"], 5)
    tail = workflow("u", ["b", "c"], 5)            # the tail of `long`, seen as often: says nothing more
    frequent_tail = workflow("u", ["b", "c"], 9)   # ... seen more often: kept
    other_user = workflow("v", ["b", "c"], 1)      # another user's: kept
    head = workflow("u", ["a", "b"], 1)            # a head, not a tail: kept
    recurring = Pattern("r", "u", "recurring_parameter", "a", {}, 1, 0.5, 0.5, START, START)
    kept = _without_redundant_workflows([long, tail, frequent_tail, other_user, head, recurring])
    assert kept == [long, frequent_tail, other_user, head, recurring]
