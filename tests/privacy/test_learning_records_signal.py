"""Learning records signal, never copies of memories or noise: through a real MCP client on the real
app, the interaction log keeps the options and shapes of the memory tools' calls (never a value, a
query, a path or a key), refused calls keep no parameters, 50 ordinary varied calls teach no
preference, and a real recurring option still becomes one once it is seen in two sessions."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from fastmcp import Client

from amfs_server.core.learning_signal import is_plausible_choice, own_call_parameters
from amfs_server.server.app import create_app
from amfs_server.server.composition import build_service
from amfs_server.server.config_file import build_learning_service
from amfs_server.server.settings import load_settings

TOPICS = ["retry policy", "deploy window", "on-call rota", "db failover", "cache ttl", "feature flag", "api quota"]


def make_app(data_dir: Path):
    """The real app over data_dir. In-memory (and stdio) clients share one session per server, so each
    app is one session."""
    settings = load_settings({}, data_dir=data_dir, embedder="none")
    return create_app(build_service(settings), settings), settings


async def learned(settings) -> tuple[list, list, str]:
    learning = build_learning_service(settings)
    await learning.open()
    try:
        preferences = await learning.get_preferences(None, min_confidence=0)
        patterns = await learning.patterns()
        exported = json.dumps(await learning.export())
    finally:
        await learning.close()
    return preferences, patterns, exported


async def ordinary_calls(client: Client, session: int, marker: str) -> None:
    for n in range(25):
        topic = TOPICS[(n + session) % len(TOPICS)]
        await client.call_tool("amfs_write", {
            "entity_path": f"team/{topic.replace(' ', '-')}", "key": f"note-{session}-{n}",
            "value": f"{marker} {topic}: decision {n} of session {session}, {'max 3 attempts' if n % 2 else 'weekly'}",
            "confidence": round(0.5 + (n % 5) / 10, 1),
        })
        await client.call_tool("amfs_retrieve", {"query": f"what did we decide about {topic} {marker}?"})


async def test_fifty_ordinary_memory_calls_teach_no_preference_and_store_no_content(tmp_path) -> None:
    marker = "zqx" + uuid.uuid4().hex[:10] + "vk"
    for session in (1, 2):  # two server runs, two sessions: the two-session rule is not what keeps them out
        app, settings = make_app(tmp_path)
        async with Client(app) as client:
            await ordinary_calls(client, session, marker)
    preferences, patterns, exported = await learned(settings)
    assert [p for p in preferences if p.category.startswith("amfs_")] == []
    assert [p for p in patterns if p.pattern_type == "recurring_parameter"] == []
    assert marker not in exported and "team/" not in exported and "note-1-" not in exported
    learning_db = (tmp_path / "learning.db").read_bytes() + b"".join(
        p.read_bytes() for p in tmp_path.glob("learning.db-*"))
    assert marker.encode() not in learning_db
    interactions = json.loads(exported)["interactions"]
    assert len(interactions) == 100
    write = next(i for i in interactions if i["tool_name"] == "amfs_write")
    assert set(write["parameters"]) == {"[shapes]"}  # confidence is something the entry holds, not an option
    assert set(write["parameters"]["[shapes]"]) == {"entity_path", "key", "value", "confidence"}
    retrieve = next(i for i in interactions if i["tool_name"] == "amfs_retrieve")
    assert retrieve["parameters"] == {"[shapes]": {"query": {"type": "string", "chars": retrieve["parameters"]["[shapes]"]["query"]["chars"]}}}


async def test_a_real_recurring_option_used_in_two_sessions_becomes_a_preference(tmp_path) -> None:
    app, settings = make_app(tmp_path)
    async with Client(app) as client:
        await client.call_tool("amfs_write", {"entity_path": "svc", "key": "k", "value": "backoff notes"})
        for n in range(4):
            await client.call_tool("amfs_retrieve", {"query": f"question {n} about backoff", "depth": 1, "limit": 4})
    (depth,) = [p for p in (await learned(settings))[0] if p.key == "depth"]
    assert (depth.category, depth.value, depth.sessions) == ("amfs_retrieve", 1, 1)
    assert depth.action == "suggest"  # four uses in one session: suggested, never applied
    app, settings = make_app(tmp_path)  # the next server run: a second session
    async with Client(app) as client:
        await client.call_tool("amfs_retrieve", {"query": "and one more question", "depth": 1, "limit": 4})
    preferences, patterns, _ = await learned(settings)
    depth = next(p for p in preferences if p.key == "depth")
    assert depth.sessions == 2 and depth.action == "auto_apply" and depth.confidence > 0.8
    assert {(p.data["parameter"], p.data["value"]) for p in patterns if p.pattern_type == "recurring_parameter"} == {
        ("depth", 1), ("limit", 4)
    }
    assert not any(p.key == "query" for p in preferences)


async def test_a_refused_call_is_recorded_with_its_error_type_and_no_parameters(tmp_path) -> None:
    marker = "zqx" + uuid.uuid4().hex[:10] + "vk"
    app, settings = make_app(tmp_path)
    async with Client(app) as client:
        refused = await client.call_tool(
            "amfs_write", {"entity_path": f"../{marker}", "key": "k", "value": f"secret {marker}"}, raise_on_error=False
        )
        assert refused.is_error
        missing = await client.call_tool("amfs_read", {"entity_path": "nowhere", "key": marker}, raise_on_error=False)
        assert missing.is_error
    _, _, exported = await learned(settings)
    write, read = json.loads(exported)["interactions"]
    for interaction in (write, read):
        assert interaction["parameters"] == {}
        assert interaction["result"]["is_error"] is True and interaction["result"]["error_type"]
    assert marker not in exported


def test_only_plausible_choices_can_become_preferences() -> None:
    choices = {"style": "black", "dry_run": True, "limit": 100, "labels": ["bug", "p1"], "region": "eu-west-1",
               "repo": "octo/widgets"}
    not_choices = {
        "value": "black",  # a content name, whatever the value looks like
        "query": "retries",
        "title": "Fix the login bug",  # free text
        "style": "exponential backoff, max 3 attempts",
        "threshold": 0.8,  # a float is a measurement, not a choice
        "count": 123_456,
        "options": {"a": 1},
        "labels": [f"l{n}" for n in range(11)],
        "token": "sk-proj-Abc123def456GHI789jkl012MNO345",
        "[shapes]": "x",
    }
    assert all(is_plausible_choice(name, value) for name, value in choices.items())
    assert not any(is_plausible_choice(name, value) for name, value in not_choices.items())


def test_own_tool_calls_keep_options_and_shapes_only() -> None:
    kept = own_call_parameters({"query": "where is ada?", "limit": 5, "memory_type": "fact", "entity_path": "people",
                                "explain": True, "mode": "a long free text mode"})
    assert kept == {"limit": 5, "memory_type": "fact", "explain": True, "[shapes]": {
        "query": {"type": "string", "chars": 13}, "entity_path": {"type": "string", "chars": 6},
        "mode": {"type": "string", "chars": 21}}}


async def test_opening_an_older_learning_database_drops_the_memory_content_it_recorded(tmp_path) -> None:
    import sqlite3

    from amfs_server.adapters.sqlite_learning import MIGRATIONS, SQLiteLearningStore

    marker = "zqx" + uuid.uuid4().hex[:10] + "vk"
    path = tmp_path / "learning.db"
    conn = sqlite3.connect(path)
    conn.executescript(MIGRATIONS[0] + ";PRAGMA user_version = 1;")
    conn.execute("INSERT INTO learning_interactions VALUES ('i1', 'u', 's', 'amfs_write', 'mcp', ?, NULL, '{}', 1, 0)",
                 (json.dumps({"entity_path": "people/ada", "value": f"lives at {marker}"}),))
    conn.execute("INSERT INTO learning_interactions VALUES ('i2', 'u', 's', 'deploy', 'reported', ?, NULL, '{}', 1, 0)",
                 (json.dumps({"region": "eu-west-1"}),))
    conn.execute("INSERT INTO learning_preferences VALUES ('u', 'amfs_write', 'value', ?, 0.9, 5, 5, 'observed', 0)",
                 (json.dumps(f"lives at {marker}"),))
    conn.execute("INSERT INTO learning_preferences VALUES ('u', 'deploy', 'region', '\"eu-west-1\"', 0.9, 5, 5, "
                 "'observed', 0)")
    conn.commit()
    conn.close()
    assert marker.encode() in path.read_bytes()

    store = SQLiteLearningStore(path)
    await store.open()
    try:
        interactions = {i.tool_name: i.parameters for i in await store.interactions()}
        assert interactions == {"amfs_write": {}, "deploy": {"region": "eu-west-1"}}
        assert [(p.category, p.key) for p in await store.preferences()] == [("deploy", "region")]
    finally:
        await store.close()
    assert not any(marker.encode() in p.read_bytes() for p in tmp_path.iterdir())
