"""session_bench/mcp_latency.py's concurrent mode: calls go out N at a time and each is timed (a stand-in session;
the real server runs in the README's command)."""

from __future__ import annotations

import asyncio
import os
from types import SimpleNamespace

import pytest

from amfs_server.session_bench import mcp_latency

from amfs_server.session_bench import DEFAULT_POSTGRES_DSN

# As tests/conftest.py probes it (conftest is not importable under --import-mode=importlib).
POSTGRES_DSN = os.environ.get("AMFS_TEST_POSTGRES_DSN", DEFAULT_POSTGRES_DSN)


class SlowSession:
    """Answers every call after `delay_s`; records how many calls were in flight at once."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s, self.in_flight, self.most, self.asked = delay_s, 0, 0, []

    async def call_tool(self, tool: str, arguments: dict) -> SimpleNamespace:
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        self.asked.append((tool, arguments["query"]))
        await asyncio.sleep(self.delay_s)
        self.in_flight -= 1
        return SimpleNamespace(is_error=False, content=[])


def test_concurrent_retrieves_keep_n_calls_in_flight_and_time_each():
    session = SlowSession(0.05)
    queries = [f"q{n}" for n in range(10)]
    stats = asyncio.run(mcp_latency.concurrent_retrieves(session, queries, 4))
    assert session.most == 4 and [q for _, q in session.asked] == queries  # groups of 4, 4, 2, every query once
    assert stats["n"] == 10 and stats["concurrent"] == 4 and stats["p50_ms"] >= 50
    # Three rounds of at least 50 ms for ten calls: at most ~67/s, and well above one at a time (10 x 50 ms: 20/s).
    assert 25 < stats["calls_per_s"] <= 10 / 0.15 + 0.1


def test_concurrent_must_be_at_least_one():
    with pytest.raises(SystemExit):
        mcp_latency.main(["--concurrent", "0"])


def test_a_second_query_encoder_times_the_same_preloaded_store_again(tmp_path, monkeypatch, capsys):
    """One preload, two servers one after the other on it; each row says which encoder it timed (a real server
    over stdio; embeddings off, so no model loads)."""
    preloads = []
    real_preload = mcp_latency.preload

    async def counting_preload(env, entries, **options):
        preloads.append(env["AMFS_DATA_DIR"])
        await real_preload(env, entries, **options)

    monkeypatch.setattr(mcp_latency, "preload", counting_preload)
    out = tmp_path / "latency.json"
    assert mcp_latency.main(["--transport", "stdio", "--calls", "3", "--seed-entries", "2", "--warmup", "1",
                             "--embedder", "none", "--preload-entries", "5", "--query-encoder", "full",
                             "--then-query-encoder", "auto", "--json", str(out)]) == 0
    import json

    document = json.loads(out.read_text())
    assert [row["query_encoder"] for row in document["results"]] == ["full", "auto"]
    assert all(row["amfs_retrieve"]["n"] == 3 for row in document["results"])
    assert len(preloads) == 1
    assert "query encoder auto:" in capsys.readouterr().out


def test_an_unknown_second_query_encoder_is_refused(capsys):
    with pytest.raises(SystemExit):
        mcp_latency.main(["--then-query-encoder", "turbo"])
    assert "--then-query-encoder: invalid choice: 'turbo'" in capsys.readouterr().err


def test_a_preload_with_few_real_vectors_fills_the_store_with_every_turn(tmp_path):
    """`--real-vectors N`: N turns embedded (8 make up to 24 distinct mixtures), the others given mixtures of their vectors; every turn is in the store
    with its real text, and a retrieve by meaning finds an embedded one."""
    from amfs_server.core.models import Actor
    from amfs_server.server.composition import build_service
    from amfs_server.server.settings import load_settings

    env = mcp_latency.server_env(tmp_path / "store", AMFS_EMBEDDER="chat-minilm")
    asyncio.run(mcp_latency.preload(env, 30, real_vectors=8))

    async def check():
        from amfs_server.core.models import utcnow

        service = build_service(load_settings(environ=env))
        await service.open()
        try:
            counts = await service.store.entity_counts(None, utcnow())
            found = await service.retrieve(Actor("agent/test", "s"), mcp_latency._turn(3), limit=3)
            return counts, [hit.entry.key for hit in found]
        finally:
            await service.close()

    counts, keys = asyncio.run(check())
    assert sum(counts.values()) == 30 and min(counts) == "conv-00" and max(counts) == "conv-29"
    assert keys[0] == "turn-000003"


@pytest.mark.parametrize(("arguments", "message"), [
    (["--real-vectors", "5"], "--real-vectors: needs --preload-entries"),
    (["--real-vectors", "100", "--preload-entries", "10000"],
     "100 real vectors make at most 4900 distinct mixtures; 10000 entries need N >= 141"),
])
def test_real_vectors_that_cannot_stand_for_the_preload_are_refused_before_any_work(arguments, message, capsys):
    with pytest.raises(SystemExit):
        mcp_latency.main(arguments)
    assert message in capsys.readouterr().err


def test_store_postgres_times_a_server_on_a_fresh_schema_and_drops_it(tmp_path, monkeypatch):
    """`--store postgres`: the preload and the server both use one fresh schema of the PostgreSQL at
    AMFS_POSTGRES_DSN (a real server over stdio, embeddings off), and the schema is gone after the run."""
    import json

    import asyncpg

    from amfs_server.session_bench import postgres_problem

    if reason := asyncio.run(postgres_problem(POSTGRES_DSN)):
        pytest.skip(reason)
    monkeypatch.setenv("AMFS_POSTGRES_DSN", POSTGRES_DSN)
    seen = []
    real_measure = mcp_latency.measure

    async def rows_in_the_schema(env):
        schema = env["AMFS_POSTGRES_DSN"].rsplit("search_path=", 1)[1]
        conn = await asyncpg.connect(POSTGRES_DSN)
        try:
            return schema, await conn.fetchval(f'SELECT count(*) FROM "{schema}".entries')
        finally:
            await conn.close()

    async def checking_measure(transport, env, *args, **kwargs):
        seen.append(await rows_in_the_schema(env))  # the preload went there, before the server started
        return await real_measure(transport, env, *args, **kwargs)

    monkeypatch.setattr(mcp_latency, "measure", checking_measure)
    out = tmp_path / "latency.json"
    assert mcp_latency.main(["--transport", "stdio", "--store", "postgres", "--calls", "3", "--seed-entries", "2",
                             "--warmup", "1", "--embedder", "none", "--preload-entries", "5", "--json", str(out)]) == 0
    document = json.loads(out.read_text())
    assert document["store"] == "postgres" and document["results"][0]["amfs_retrieve"]["n"] == 3
    [(schema, preloaded)] = seen
    assert schema.startswith("amfs_bench_latency_") and preloaded == 5

    async def schema_left() -> bool:
        conn = await asyncpg.connect(POSTGRES_DSN)
        try:
            return bool(await conn.fetchval("SELECT count(*) FROM pg_namespace WHERE nspname = $1", schema))
        finally:
            await conn.close()

    assert not asyncio.run(schema_left())


def test_store_postgres_without_a_server_says_how_to_get_one_before_any_work(monkeypatch, capsys):
    monkeypatch.setenv("AMFS_POSTGRES_DSN", "postgresql://postgres:hunter2@127.0.0.1:1/test")
    with pytest.raises(SystemExit):
        mcp_latency.main(["--store", "postgres", "--preload-entries", "10"])
    err = capsys.readouterr().err
    assert "--store postgres: cannot connect to PostgreSQL at postgresql://postgres@127.0.0.1:1/test" in err
    assert "scripts/ensure_postgres.sh" in err and "hunter2" not in err


def test_store_postgres_with_a_dsn_that_does_not_parse_never_shows_its_password(monkeypatch, capsys):
    # An unencoded '/' in the password: the driver's own message quoted a piece of it ('hun').
    monkeypatch.setenv("AMFS_POSTGRES_DSN", "postgresql://u:hun/ter2@127.0.0.1:1/test")
    with pytest.raises(SystemExit):
        mcp_latency.main(["--store", "postgres"])
    err = capsys.readouterr().err
    assert "--store postgres: cannot use the DSN" in err and "percent-encoding" in err
    assert "hun" not in err and "ter2" not in err


def test_store_postgres_drops_its_schema_when_the_run_fails(monkeypatch):
    import asyncpg

    from amfs_server.session_bench import postgres_problem

    if reason := asyncio.run(postgres_problem(POSTGRES_DSN)):
        pytest.skip(reason)
    monkeypatch.setenv("AMFS_POSTGRES_DSN", POSTGRES_DSN)
    schemas = []

    async def schema_count(schema: str, create: bool = False) -> int:
        conn = await asyncpg.connect(POSTGRES_DSN)
        try:
            if create:
                await conn.execute(f'CREATE SCHEMA "{schema}"')
            return await conn.fetchval("SELECT count(*) FROM pg_namespace WHERE nspname = $1", schema)
        finally:
            await conn.close()

    async def failing_measure(transport, env, *args, **kwargs):
        schemas.append(env["AMFS_POSTGRES_DSN"].rsplit("search_path=", 1)[1])
        assert await schema_count(schemas[-1], create=True) == 1  # as the server makes it
        raise RuntimeError("the server went away")

    async def preload_nothing(env, entries, **options):
        return None

    monkeypatch.setattr(mcp_latency, "measure", failing_measure)
    monkeypatch.setattr(mcp_latency, "preload", preload_nothing)
    with pytest.raises(RuntimeError, match="the server went away"):
        mcp_latency.main(["--transport", "stdio", "--store", "postgres", "--embedder", "none"])
    assert len(schemas) == 1 and asyncio.run(schema_count(schemas[0])) == 0


def test_a_preloaded_sqlite_store_is_made_once_and_reused(tmp_path, monkeypatch):
    preloads = []

    async def counting_preload(env, entries, **options):
        preloads.append((env["AMFS_DATA_DIR"], entries, options))

    monkeypatch.setattr(mcp_latency, "preload", counting_preload)
    folder = tmp_path / "preloaded-40-8"
    first = mcp_latency.preloaded_env(folder, 40, 8)
    again = mcp_latency.preloaded_env(folder, 40, 8)
    assert first == again and first["AMFS_DATA_DIR"] == str(folder)
    assert preloads == [(str(folder), 40, {"real_vectors": 8})]  # a second preload would add to the store
    postgres = mcp_latency.preloaded_env(folder, 40, 8, dsn="postgresql://x@127.0.0.1/test?search_path=fresh")
    assert postgres["AMFS_POSTGRES_DSN"].endswith("search_path=fresh") and len(preloads) == 2  # a fresh schema, always
