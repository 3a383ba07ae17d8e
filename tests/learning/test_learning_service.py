"""LearningService over both stores ([sqlite], [postgres]): the document's examples, redaction at rest,
retention, the off switches, forgetting, and the export/import round trip."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest

from amfs_server.core.errors import NotFoundError, ValidationError
from amfs_server.core.learning import Interaction, LearningService
from amfs_server.core.models import Actor
from amfs_server.core.patterns import PatternDraft
from amfs_server.core.redaction import pseudonym

from .conftest import Clock

GITHUB = ["github_create_issue", "github_add_labels", "github_assign"]
PASSWORD = "correct-horse-battery-staple"
SECRETS = [
    PASSWORD,
    "sk-proj-Abc123def456GHI789jkl012MNO345",
    "ghp_1A2b3C4d5E6f7G8h9I0jK1lM2nO3pQ4rS5tU",
    "AKIAIOSFODNN7EXAMPLE",
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7",
]


async def use(learning: LearningService, actor: Actor, clock: Clock, tool: str, minutes: float = 1, **params: Any) -> Interaction:
    clock.advance(minutes=minutes)
    interaction = await learning.record_interaction(actor, tool, params)
    assert interaction is not None
    return interaction


async def stored_text(store: Any) -> str:
    """Everything the store holds, as text: the SQLite files' bytes, or every PostgreSQL row."""
    if store.name == "sqlite":
        await store.close()  # checkpoints the WAL into the file
        text = "".join(p.read_bytes().decode("latin-1") for p in store.path.parent.glob(store.path.name + "*"))
        await store.open()
        return text
    rows: list[str] = []
    for table in ("learning_interactions", "learning_preferences", "learning_patterns"):
        rows += [r["row"] for r in await store._fetch(f"SELECT t::text AS row FROM {table} t")]
    return "\n".join(rows)


# -- preferences: the document's examples -------------------------------------------------------


async def test_after_five_consistent_uses_in_two_sessions_a_preference_is_applied_automatically(
    learning, actor, clock
) -> None:
    for n in range(5):
        session = actor if n < 2 else Actor(actor.agent_id, "a-later-session")
        await use(learning, session, clock, "format_code", code=f"print({n})", style="black", line_length=120)
        (style,) = [p for p in await learning.get_preferences(actor.agent_id, "format_code") if p.key == "style"]
        if n == 3:
            assert style.action == "confirm" and style.confidence < 0.8
    (style,) = [p for p in await learning.get_preferences(actor.agent_id, "format_code") if p.key == "style"]
    assert (style.value, style.sample_size, style.source) == ("black", 5, "observed")
    assert style.confidence == pytest.approx(0.856, abs=0.001) and style.action == "auto_apply"
    assert style.sessions == 2
    # `code` is content (a free-text value that changes every call), never a preference
    assert [p for p in await learning.get_preferences(actor.agent_id) if p.key == "code"] == []


async def test_a_habit_of_a_single_session_is_suggested_but_never_applied(learning, actor, clock) -> None:
    for _ in range(10):
        await use(learning, actor, clock, "format_code", style="black")
    (style,) = await learning.get_preferences(actor.agent_id, "format_code")
    assert style.sessions == 1 and style.action == "suggest"
    assert round(style.confidence, 2) == 0.58 and style.confidence < learning.config.thresholds.confirm
    await use(learning, Actor(actor.agent_id, "the-next-day"), clock, "format_code", style="black")
    (style,) = await learning.get_preferences(actor.agent_id, "format_code")
    assert style.sessions == 2 and style.action == "auto_apply" and style.confidence > 0.98


async def test_one_correction_moves_a_preference_and_consistent_uses_rebuild_it(learning, actor, clock) -> None:
    for _ in range(5):
        await use(learning, actor, clock, "format_code", style="pep8")
    corrected = await learning.set_preference(actor.agent_id, "format_code", "style", "black")
    assert (corrected.value, corrected.action, corrected.source) == ("black", "suggest", "corrected")
    assert corrected.confidence == pytest.approx(0.4)  # "Confidence: 0.4 (after 1 correction)"
    for _ in range(4):
        await use(learning, actor, clock, "format_code", style="black")
    (week3,) = await learning.get_preferences(actor.agent_id, "format_code")
    assert round(week3.confidence, 2) in (0.85, 0.86) and week3.action == "auto_apply"  # "0.85 (after 5 consistent uses)"
    for _ in range(5):
        await learning.observe_preference(actor.agent_id, "format_code", "style", "black")
    (week4,) = await learning.get_preferences(actor.agent_id, "format_code")
    assert round(week4.confidence, 2) == 0.98 and week4.sample_size == 15  # "0.98 (after 10 consistent uses)"


async def test_preferences_are_per_user_and_category_and_filtered_by_confidence(learning, actor, clock) -> None:
    bob = Actor("agent/bob", "session-2")
    await learning.set_preference(actor.agent_id, "code_formatting", "line_length", 120)
    await learning.set_preference(bob.agent_id, "code_formatting", "line_length", 88)
    await learning.set_preference(actor.agent_id, "github", "default_labels", ["bug", "priority:high"])
    mine = await learning.get_preferences(actor.agent_id)
    assert [(p.name, p.value) for p in mine] == [("code_formatting.line_length", 120), ("github.default_labels", ["bug", "priority:high"])]
    assert [p.value for p in await learning.get_preferences(bob.agent_id, "code_formatting")] == [88]
    assert await learning.get_preferences(actor.agent_id, min_confidence=0.5) == []
    assert len(await learning.get_preferences(None)) == 3


async def test_set_preference_refuses_credentials_and_bad_names(learning, actor) -> None:
    with pytest.raises(ValidationError, match="credential"):
        await learning.set_preference(actor.agent_id, "github", "default_repo", SECRETS[2])
    with pytest.raises(ValidationError, match="without '.'"):
        await learning.set_preference(actor.agent_id, "github", "a.b", 1)
    with pytest.raises(ValidationError, match="category"):
        await learning.set_preference(actor.agent_id, "a/b", "k", 1)
    assert await learning.get_preferences(None) == []


# -- patterns ---------------------------------------------------------------------------------


async def test_three_identical_fetch_users_calls_within_minutes_give_a_recurring_parameter_pattern(learning, actor, clock) -> None:
    for _ in range(2):
        await use(learning, actor, clock, "fetch_users", minutes=5, limit=100)
    assert await learning.patterns(actor.agent_id) == []
    await use(learning, actor, clock, "fetch_users", minutes=5, limit=100)
    (pattern,) = await learning.patterns(actor.agent_id, tool_name="fetch_users")  # re-detected: interactions changed
    assert pattern.pattern_type == "recurring_parameter"
    assert (pattern.data["parameter"], pattern.data["value"], pattern.frequency) == ("limit", 100, 1.0)
    assert pattern.confidence == pytest.approx(0.75) and pattern.action == "confirm"
    assert await learning.patterns(actor.agent_id, min_confidence=0.9) == []
    again = await learning.patterns(actor.agent_id)
    assert again[0].updated_at == pattern.updated_at  # nothing new: not rewritten


async def github_issue_days(learning: LearningService, actor: Actor, clock: Clock, days: int) -> None:
    for day in range(days):
        session = Actor(actor.agent_id, f"day-{day}")
        clock.advance(days=1)
        await use(learning, session, clock, "github_create_issue", title=f"Fix bug {day}")
        await use(learning, session, clock, "github_add_labels", labels=["bug"])
        await use(learning, session, clock, "github_assign", assignee="ada")


async def test_the_github_issue_workflow_is_detected_and_suggested(learning, actor, clock) -> None:
    await github_issue_days(learning, actor, clock, 3)
    workflows = [p for p in await learning.patterns(actor.agent_id) if p.pattern_type == "workflow"]
    assert [p.tools for p in workflows] == [GITHUB]  # its tail (labels -> assign) says nothing more
    assert workflows[0].frequency == 1.0 and workflows[0].occurrences == 3
    assert [p.tools for p in await learning.patterns(actor.agent_id, tool_name="github_assign") if p.pattern_type == "workflow"] == [GITHUB]

    (suggestion,) = await learning.suggest_next(actor.agent_id, "github_create_issue")
    assert suggestion.workflow == GITHUB
    assert [(s.tool_name, s.usual_parameters) for s in suggestion.steps] == [
        ("github_add_labels", {"labels": ["bug"]}), ("github_assign", {"assignee": "ada"}),
    ]
    assert suggestion.steps[0].action == "confirm" and suggestion.action == "confirm"
    assert [s.steps[0].tool_name for s in await learning.suggest_next(actor.agent_id, "github_add_labels")] == ["github_assign"]
    assert await learning.suggest_next(actor.agent_id, "github_assign") == []
    assert await learning.suggest_next("agent/someone-else", "github_create_issue") == []

    await github_issue_days(learning, actor, clock, 7)
    (stronger,) = await learning.suggest_next(actor.agent_id, "github_create_issue")
    assert stronger.confidence > 0.9 and stronger.action == "auto_apply"


async def test_detect_patterns_on_demand_covers_every_user_and_the_llm_hook_adds_findings(make_learning, actor, clock) -> None:
    class Analyzer:
        seen: list[int] = []

        async def analyze(self, user_id: str, interactions: Sequence[Interaction]) -> list[PatternDraft]:
            self.seen.append(len(interactions))
            return [PatternDraft("insight", "fetch_users", "prefers-small-pages", {"note": "pages of 100"}, 3, 1.0, 0.7)]

    plain = make_learning()
    assert plain.analyzer is None  # off by default: no API key, no network
    hooked = LearningService(plain.store, plain.config, analyzer=Analyzer(), clock=clock)
    for _ in range(3):
        await use(hooked, actor, clock, "fetch_users", limit=100)
    found = await hooked.detect_patterns()
    assert sorted(p.pattern_type for p in found) == ["insight", "recurring_parameter"]
    assert Analyzer.seen == [3]


# -- privacy ------------------------------------------------------------------------------------


async def test_planted_secrets_never_reach_the_database_or_an_export(learning, actor, clock) -> None:
    result_body_marker = "RESULT-BODY-MUST-NOT-BE-STORED"
    await use(learning, actor, clock, "deploy", password=PASSWORD, region="eu-west-1")
    await use(learning, actor, clock, "call_api", headers={"Authorization": f"Bearer {SECRETS[1]}"}, url="https://api.example.com")
    await use(learning, actor, clock, "run_sql", dsn=f"postgresql://admin:{PASSWORD}@db/prod", query="select 1")
    for secret in SECRETS[1:]:
        await use(learning, actor, clock, "misc", note=f"use {secret} here", api_key=secret)
    reported = await learning.record_interaction(
        actor, "github_create_issue", {"title": "t", "github_token": SECRETS[2]}, outcome=f"ok, token {SECRETS[2]}"
    )
    assert reported is not None and reported.parameters["github_token"] == "[REDACTED]" and reported.outcome == "[REDACTED]"
    assert result_body_marker not in json.dumps([i.to_dict() for i in await learning.interactions()])

    exported = json.dumps(await learning.export())
    at_rest = await stored_text(learning.store)
    for secret in SECRETS:
        assert secret not in exported and secret not in at_rest, secret
    assert "eu-west-1" in exported and "[REDACTED]" in exported
    names = {p.name for p in await learning.get_preferences(None)}
    assert "deploy.region" in names and "deploy.password" not in names and "misc.api_key" not in names


async def test_anonymize_stores_pseudonyms_for_users_and_sessions(make_learning, actor, clock) -> None:
    learning = make_learning(anonymize=True)
    await use(learning, actor, clock, "fetch_users", limit=100, contact="ada@example.com")
    (interaction,) = await learning.interactions()
    assert interaction.user_id == pseudonym(actor.agent_id) and interaction.session_id == pseudonym(actor.session_id)
    assert interaction.parameters["contact"] == "[EMAIL]"
    assert [p.user_id for p in await learning.get_preferences(actor.agent_id)] == [pseudonym(actor.agent_id)]
    assert actor.agent_id not in await stored_text(learning.store)


# -- retention ------------------------------------------------------------------------------------


async def test_retention_deletes_old_interactions_and_the_patterns_they_supported(make_learning, actor, clock) -> None:
    learning = make_learning(retention_days=90)
    for _ in range(3):
        await use(learning, actor, clock, "fetch_users", limit=100)
    assert len(await learning.patterns(actor.agent_id)) == 1
    clock.advance(days=91)
    await use(learning, actor, clock, "fetch_users", limit=50)  # recording enforces retention (hourly)
    assert [i.parameters["limit"] for i in await learning.interactions()] == [50]
    assert await learning.patterns(actor.agent_id) == []
    clock.advance(days=10)
    assert await learning.purge(retention_days=5) == 1
    assert await learning.interactions() == []


async def test_retention_is_enforced_when_the_service_opens(make_learning, actor, clock) -> None:
    first = make_learning(retention_days=30)
    await use(first, actor, clock, "fetch_users", limit=100)
    clock.advance(days=31)
    later = make_learning(retention_days=30)
    await later.open()
    assert await later.interactions() == []


# -- the off switches -----------------------------------------------------------------------------


async def test_with_learning_off_nothing_is_recorded(make_learning, actor, clock) -> None:
    learning = make_learning(enabled=False)
    assert await learning.record_interaction(actor, "fetch_users", {"limit": 100}) is None
    assert await learning.observe_preference(actor.agent_id, "format_code", "style", "black") is None
    with pytest.raises(ValidationError, match="Learning is off"):
        await learning.set_preference(actor.agent_id, "format_code", "style", "black")
    assert await learning.interactions() == [] and await learning.get_preferences(None) == []
    assert await learning.patterns() == []


async def test_with_preference_learning_off_interactions_are_kept_but_no_preference(make_learning, actor, clock) -> None:
    learning = make_learning(preference_learning=False)
    for _ in range(3):
        await use(learning, actor, clock, "fetch_users", limit=100)
    assert len(await learning.interactions()) == 3
    assert await learning.get_preferences(None) == []
    with pytest.raises(ValidationError, match="Preference learning is off"):
        await learning.set_preference(actor.agent_id, "fetch_users", "limit", 100)
    assert len(await learning.patterns()) == 1


async def test_with_pattern_detection_off_no_pattern_is_stored(make_learning, actor, clock) -> None:
    learning = make_learning(pattern_detection=False)
    for _ in range(3):
        await use(learning, actor, clock, "fetch_users", limit=100)
    assert await learning.patterns() == [] and await learning.store.patterns() == []
    assert await learning.suggest_next(actor.agent_id, "fetch_users") == []
    with pytest.raises(ValidationError, match="Pattern detection is off"):
        await learning.detect_patterns()
    assert len(await learning.get_preferences(None)) == 1


# -- forgetting, clearing, export / import -------------------------------------------------------------


async def test_forgetting_a_learned_preference_forgets_what_it_was_learned_from(learning, actor, clock) -> None:
    """Red-team repro: after `memory forget deploy_service.region` the value was still in the recorded calls, a
    recurring-parameter pattern and amfs_suggest_next's usual parameters."""
    for day in range(3):
        session = Actor(actor.agent_id, f"day-{day}")
        clock.advance(days=1)
        await use(learning, session, clock, "build", target="app")
        await use(learning, session, clock, "deploy_service", region="PREFMARK-eu-west-9", replicas=3)
    await use(learning, Actor("agent/bob", "b"), clock, "deploy_service", region="PREFMARK-bob")
    assert "deploy_service.region" in [p.name for p in await learning.get_preferences(actor.agent_id)]
    (before,) = await learning.suggest_next(actor.agent_id, "build")
    assert before.steps[0].usual_parameters["region"] == "PREFMARK-eu-west-9"

    assert await learning.forget_preference(actor.agent_id, "deploy_service", "region") == 1
    (after,) = await learning.suggest_next(actor.agent_id, "build")  # the workflow stays, the value is gone
    assert after.steps[0].usual_parameters == {"replicas": 3}
    patterns = json.dumps([p.to_dict() for p in await learning.patterns(actor.agent_id)], default=str)
    assert "PREFMARK" not in patterns and "replicas" in patterns
    mine = [i.parameters for i in await learning.interactions(actor.agent_id) if i.tool_name == "deploy_service"]
    assert mine == [{"replicas": 3}] * 3
    assert "PREFMARK-eu-west-9" not in await stored_text(learning.store)
    assert "PREFMARK-bob" in await stored_text(learning.store)  # another user's calls are theirs


async def test_forget_removes_one_preference_and_clear_removes_everything(learning, actor, clock) -> None:
    await learning.set_preference(actor.agent_id, "code_formatting", "style", "black")
    await learning.set_preference("agent/bob", "code_formatting", "style", "pep8")
    await learning.set_preference(actor.agent_id, "code_formatting", "line_length", 120)
    assert await learning.forget_preference(actor.agent_id, "code_formatting", "style") == 1
    assert [p.name for p in await learning.get_preferences(actor.agent_id)] == ["code_formatting.line_length"]
    assert await learning.forget_preference(None, "code_formatting", "style") == 1  # bob's
    with pytest.raises(NotFoundError, match="nothing was forgotten"):
        await learning.forget_preference(None, "code_formatting", "style")
    for _ in range(3):
        await use(learning, actor, clock, "fetch_users", limit=100)
    await learning.patterns()
    await learning.clear()
    assert await learning.export() == {"interactions": [], "preferences": [], "patterns": []}


async def test_export_import_round_trip_is_exact_and_a_second_import_is_refused(learning, actor, clock) -> None:
    await github_issue_days(learning, actor, clock, 3)
    await learning.set_preference(actor.agent_id, "code_formatting", "style", "black")
    await learning.patterns()
    exported = await learning.export()
    # preferences: labels, assignee and the correction; the issue titles are free text, never a preference
    assert {name: len(rows) for name, rows in exported.items()} == {"interactions": 9, "preferences": 3, "patterns": 7}
    document = json.loads(json.dumps(exported))  # through JSON, as in an export file

    await learning.clear()
    imported = await learning.import_(document)
    assert len(imported.interactions) == 9
    assert await learning.export() == exported
    assert await learning.patterns(actor.agent_id) == await learning.patterns(actor.agent_id)

    with pytest.raises(ValidationError, match="refuses to overwrite"):
        await learning.check_import(document)
    with pytest.raises(ValidationError, match="refuses to overwrite"):
        await learning.import_(document)
    assert await learning.export() == exported


async def test_import_redacts_planted_secrets_and_refuses_malformed_records(learning, actor, clock) -> None:
    await use(learning, actor, clock, "deploy", region="eu-west-1")
    document = await learning.export()
    await learning.clear()
    document["interactions"][0]["parameters"]["api_key"] = SECRETS[1]
    document["interactions"][0]["outcome"] = f"done with {SECRETS[2]}"
    document["preferences"].append({**document["preferences"][0], "key": "token_value", "value": SECRETS[3]})
    await learning.import_(document)
    text = json.dumps(await learning.export()) + await stored_text(learning.store)
    assert all(secret not in text for secret in SECRETS)
    assert [p.key for p in await learning.get_preferences(None)] == ["region"]

    await learning.clear()
    broken = {"interactions": [{"interaction_id": "x"}]}
    with pytest.raises(ValidationError, match=r"extra\.interactions\[0\]"):
        await learning.import_(broken)
    assert await learning.interactions() == []

    # Names follow the tools' rules: a credential as a tool name is refused, one under a credential's name dropped.
    planted_tool = {"interactions": [{**document["interactions"][0], "tool_name": "ghp_" + "a" * 36}]}
    with pytest.raises(ValidationError, match=r"extra\.interactions\[0\].*credential"):
        await learning.import_(planted_tool)
    named_secret = {"preferences": [{**document["preferences"][0], "category": "db", "key": "password", "value": "hunter2"}]}
    await learning.import_(named_secret)
    assert await learning.get_preferences(None) == []
    with pytest.raises(ValidationError, match=r"extra\.preferences\[0\]\.sample_size"):
        await learning.import_({"preferences": [{**document["preferences"][0], "sample_size": 10**30}]})


async def test_record_interaction_validates_its_input(learning, actor) -> None:
    with pytest.raises(ValidationError, match="tool_name"):
        await learning.record_interaction(actor, "bad name!", {})
    with pytest.raises(ValidationError, match="parameters must be an object"):
        await learning.record_interaction(actor, "fetch_users", ["limit"])  # type: ignore[arg-type]
    assert await learning.interactions() == []


@pytest.mark.parametrize("call", [
    {"execution_ms": float("inf")}, {"execution_ms": float("nan")}, {"execution_ms": True},
    {"parameters": {"region": float("nan")}}, {"parameters": {"retry": {"backoff": [1.0, float("-inf")]}}},
    {"outcome": float("inf")},
])
async def test_a_non_finite_number_in_a_reported_call_is_refused_and_nothing_is_stored(learning, actor, call) -> None:
    """Infinity in execution_ms was stored, and from then on every `memory export` of the store failed; a NaN
    parameter was learned as the preference "nan" (red-team repros)."""
    with pytest.raises(ValidationError, match="finite"):
        await learning.record_interaction(actor, "deploy", call.get("parameters", {"region": "eu"}),
                                          outcome=call.get("outcome"), execution_ms=call.get("execution_ms"))
    with pytest.raises(ValidationError, match=r"value is nan; numbers must be finite"):
        await learning.set_preference(actor.agent_id, "deploy", "retries", float("nan"))
    assert await learning.interactions() == [] and await learning.get_preferences(None) == []
    json.dumps(await learning.export(), allow_nan=False)  # what `memory export` writes stays valid JSON


async def test_a_refused_mcp_call_with_a_non_finite_argument_is_recorded_without_its_arguments(learning, actor) -> None:
    """`amfs_write(confidence=Infinity)` is refused by the tool; its record keeps no arguments, so the non-finite one
    does not stop it being recorded (every such call logged three tracebacks; red-team finding, 0.7.15)."""
    from amfs_server.core.learning_records import ResultMeta

    interaction = await learning.record_interaction(
        actor, "amfs_write", {"entity_path": "a", "key": "b", "value": "v", "confidence": float("inf")},
        result=ResultMeta(is_error=True, error_type="ToolError"), source="mcp")
    assert interaction is not None and interaction.parameters == {} and interaction.result["is_error"]
    json.dumps(await learning.export(), allow_nan=False)


async def test_oversized_parameters_keep_only_their_names_and_size(learning, actor) -> None:
    bulk = {"rows": [{"id": n, "note": "x" * 500} for n in range(100)], "table": "users"}
    interaction = await learning.record_interaction(actor, "bulk_insert", bulk)
    assert interaction is not None
    (kept,) = interaction.parameters.values()
    assert kept["names"] == ["rows", "table"] and kept["size_bytes"] > 16_384
    assert await learning.get_preferences(None) == []


@pytest.mark.parametrize("key", ["password", "db_pw", "pin", "api_key"])
async def test_a_preference_named_like_a_credential_is_refused_and_nothing_is_stored(learning, actor, key) -> None:
    from amfs_server.core.errors import ValidationError

    with pytest.raises(ValidationError, match="credential"):
        await learning.set_preference(actor.agent_id, "db", key, "hunter2")
    assert await learning.get_preferences(actor.agent_id, "db") == []


@pytest.mark.parametrize(("category", "key"), [("db", "line_length\u200b"), ("db", "p\u200bin"), ("d\u200bb", "port")])
async def test_a_preference_name_with_an_invisible_character_is_refused(learning, actor, category, key) -> None:
    # It would look like another preference beside it, or hide a credential name (`p\u200bin`) from the check.
    from amfs_server.core.errors import ValidationError

    with pytest.raises(ValidationError, match="invisible formatting"):
        await learning.set_preference(actor.agent_id, category, key, "4711")
    assert await learning.get_preferences(actor.agent_id) == []


@pytest.mark.parametrize("tool_name", ["ghp_a1b2c3d4e5f6", "sk-abc123"])
async def test_a_credential_sent_as_tool_name_is_refused(learning, actor, tool_name) -> None:
    from amfs_server.core.errors import ValidationError

    with pytest.raises(ValidationError, match="tool_name looks like a credential"):
        await learning.record_interaction(actor, tool_name, {"x": 1})
