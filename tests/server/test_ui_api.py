"""The memory browser's HTTP API, in process through the real ASGI apps (the FastMCP HTTP app with keys, and
the standalone `amfs-server ui` app): keys, scopes, refusals, and that looking is not an agent read."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
from fastmcp.utilities.asgi_transport import StreamingASGITransport

from amfs_server.core.models import Actor
from amfs_server.core.service import MemoryService, WriteRequest
from amfs_server.ml.service import MLService
from amfs_server.server.app import create_app, http_options
from amfs_server.server.auth import parse_api_keys
from amfs_server.server.composition import build_learning_service, build_service
from amfs_server.server.settings import Settings, load_settings
from amfs_server.server.ui import UiServices, create_ui_app
from amfs_server.server.ui import api as api_module
from amfs_server.server.ui.api import CONTENT_SECURITY_POLICY

ADMIN = "admin-key-0000000000000001"
READER = "reader-key-000000000000002"
TEAM_A = "team-a-key-000000000000003"
KEYS = f"{ADMIN},{READER}:ro,{TEAM_A}:rw@team-a"
BASE = "http://127.0.0.1"
WRITER = Actor("agent/seed", "seed-session")


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def seed(service: MemoryService) -> None:
    await service.write_many(WRITER, [
        WriteRequest("team-a/payments", "retry-policy", {"retries": 3, "backoff": "exponential"}),
        WriteRequest("team-a/payments", "timeout", "30 seconds for the payments gateway"),
        WriteRequest("team-a/payments/eu", "provider", "adyen handles eu payments"),
        WriteRequest("team-b/search", "index", "the search index rebuilds nightly at 02:00"),
        WriteRequest("team-b/search", "xss", "<img src=x onerror=alert(1)>"),
    ])
    await service.write(WRITER, WriteRequest("team-a/payments", "retry-policy", {"retries": 5, "backoff": "exponential"}))
    await service.commit_outcome(
        WRITER, "deploy-1", "success", ["team-a/payments/retry-policy", "team-b/search/index"]
    )
    await service.commit_outcome(WRITER, "incident-2", "failure", ["team-b/search/index"])


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return load_settings({}, data_dir=tmp_path, embedder="none")


@asynccontextmanager
async def mcp_http(
    settings: Settings, keys: str = KEYS, transport: str = "http"
) -> AsyncIterator[tuple[httpx2.AsyncClient, MemoryService]]:
    service = build_service(settings)
    app = create_app(service, settings, api_keys=parse_api_keys(keys))
    asgi = app.http_app(transport=transport, **http_options("127.0.0.1"))
    async with asgi.router.lifespan_context(asgi):
        await seed(service)
        async with httpx2.AsyncClient(transport=StreamingASGITransport(asgi), base_url=BASE) as http:
            yield http, service


async def get(
    http: httpx2.AsyncClient, endpoint: str, key: str | None = ADMIN, /, **params: Any
) -> httpx2.Response:
    return await http.get(f"/ui/api/{endpoint}", params=params, headers=bearer(key) if key else {})


async def forget(http: httpx2.AsyncClient, key: str, entity_path: str, entry: str) -> httpx2.Response:
    return await http.post(
        "/ui/api/forget", json={"entity_path": entity_path, "key": entry},
        headers={**bearer(key), "Content-Type": "application/json"},
    )


API_CALLS = [
    ("whoami", {}), ("tree", {}), ("entries", {"path": "team-a/payments"}),
    ("entry", {"path": "team-a/payments", "key": "timeout"}), ("outcomes", {}), ("search", {"q": "payments"}),
    ("learning", {}), ("ml", {}),
]


@pytest.mark.parametrize("key", [None, "wrong-key-00000000000000000"])
async def test_every_api_call_without_a_valid_key_gets_401_and_no_data(settings: Settings, key: str | None) -> None:
    async with mcp_http(settings) as (http, service):
        for path, params in API_CALLS:
            response = await get(http, path, key, **params)
            assert response.status_code == 401, path
            assert response.headers["www-authenticate"] == "Bearer"
            assert "team-a" not in response.text and "payments" not in response.text
        refused = await forget(http, key or "wrong-key-00000000000000000", "team-a/payments", "timeout")
        assert refused.status_code == 401
        assert (await service.peek("team-a/payments", "timeout")).key == "timeout"


async def test_the_sse_transport_serves_the_same_page_and_api_behind_the_same_keys(settings: Settings) -> None:
    async with mcp_http(settings, transport="sse") as (http, _):
        assert (await http.get("/ui/")).status_code == 200
        assert (await get(http, "tree", None)).status_code == 401
        assert (await get(http, "tree", READER)).json()["total"] == 5
        assert (await get(http, "tree", TEAM_A, path="team-b")).status_code == 403


async def test_the_page_and_its_assets_load_without_a_key_under_a_strict_csp_and_hold_no_data(settings: Settings) -> None:
    async with mcp_http(settings) as (http, _):
        for path in ("/ui", "/ui/", "/ui/static/app.js", "/ui/static/style.css"):
            response = await http.get(path)
            assert response.status_code == 200, path
            assert response.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
            assert response.headers["x-content-type-options"] == "nosniff"
            assert "retry-policy" not in response.text
        csp = CONTENT_SECURITY_POLICY
        assert "default-src 'self'" in csp and "'unsafe-inline'" not in csp and "'unsafe-eval'" not in csp
        page = (await http.get("/ui")).text
        assert "<script src=" in page and "<script>" not in page and " style=" not in page
        assert (await http.get("/ui/static/../app.py")).status_code == 404
        assert (await http.get("/ui/static/nope.js")).status_code == 404
        api = await get(http, "whoami")
        assert api.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
        assert api.headers["cache-control"] == "no-store"


async def test_the_tree_counts_entries_per_entity_and_lists_them_a_page_at_a_time(settings: Settings) -> None:
    async with mcp_http(settings) as (http, _):
        root = (await get(http, "tree")).json()
        assert root["total"] == 5
        assert [(c["path"], c["total"], c["has_children"]) for c in root["children"]] == [
            ("team-a", 3, True), ("team-b", 2, True),
        ]
        payments = (await get(http, "tree", path="team-a/payments")).json()
        assert (payments["here"], payments["total"]) == (2, 3)
        assert [(c["path"], c["here"]) for c in payments["children"]] == [("team-a/payments/eu", 1)]
        first = (await get(http, "entries", path="team-a/payments", limit=1)).json()
        second = (await get(http, "entries", path="team-a/payments", limit=1, offset=1)).json()
        assert first["total"] == 2
        assert [e["key"] for e in first["entries"] + second["entries"]] == ["retry-policy", "timeout"]
        assert (await get(http, "entries", path="team-a/payments", offset=-1)).status_code == 400
        assert (await get(http, "entries", path="team-a/payments", limit=10_000)).status_code == 400


async def test_an_entry_shows_every_version_a_diff_and_its_outcomes(settings: Settings) -> None:
    async with mcp_http(settings) as (http, _):
        data = (await get(http, "entry", path="team-a/payments", key="retry-policy")).json()
        assert data["entry"]["value"] == {"retries": 5, "backoff": "exponential"}
        assert [v["version"] for v in data["versions"]] == [2, 1]
        assert data["entry"]["provenance"]["agent_id"] == "agent/seed"
        assert data["entry"]["tier_name"] in {"hot", "warm", "archive"}
        assert 0 < data["entry"]["effective_confidence"] <= 1
        assert [(o["outcome_ref"], o["version_updated"]) for o in data["outcomes"]] == [("deploy-1", 2)]
        diff = (await get(http, "diff", path="team-a/payments", key="retry-policy", **{"from": 1, "to": 2})).json()
        changed = [(line["op"], line["text"].strip()) for line in diff["lines"] if line["op"] != "same"]
        assert changed == [("remove", '"retries": 3'), ("add", '"retries": 5')]
        assert (await get(http, "diff", path="team-a/payments", key="retry-policy", **{"from": 1, "to": 9})).status_code == 404
        assert (await get(http, "entry", path="team-a/payments", key="missing")).status_code == 404


async def test_an_entry_page_shows_older_large_versions_cut_and_a_diff_reads_only_its_two(settings: Settings) -> None:
    """A red-team finding: 40 versions of ~1 MiB made one 41 MiB response to a read-only key."""
    big = [f"version {n} " + "x" * 200_000 for n in range(1, 7)]
    async with mcp_http(settings) as (http, service):
        for value in big:
            await service.write(WRITER, WriteRequest("team-a/logs", "dump", value))
        response = await get(http, "entry", READER, path="team-a/logs", key="dump")
        data = response.json()
        assert data["entry"]["value"] == big[-1]  # the current version whole
        rows = data["versions"]
        assert [r["version"] for r in rows] == [6, 5, 4, 3, 2, 1] and all(r["value_truncated"] for r in rows)
        assert rows[1]["value"].startswith(json.dumps(big[4])[:100]) and len(rows[1]["value"]) < 2100
        assert len(response.content) < 2 * 200_000 + 50_000  # the current value once in full, not six
        diff = (await get(http, "diff", READER, path="team-a/logs", key="dump", **{"from": 2, "to": 5})).json()
        changed = [line["op"] for line in diff["lines"] if line["op"] != "same"]
        assert changed == ["remove", "add"]
        assert (await get(http, "diff", READER, path="team-a/logs", key="dump", **{"from": 0, "to": 5})).status_code == 400
        assert data["older_versions"] == 0


async def test_an_entry_page_shows_the_newest_versions_and_counts_the_older_ones(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A red-team finding: thousands of versions made amfs_history hold 12 times its reply in memory."""
    monkeypatch.setattr(api_module, "ENTRY_PAGE_VERSIONS", 3)
    async with mcp_http(settings) as (http, service):
        for n in range(1, 6):
            await service.write(WRITER, WriteRequest("team-a/logs", "many", f"version {n}"))
        data = (await get(http, "entry", READER, path="team-a/logs", key="many")).json()
        assert [r["version"] for r in data["versions"]] == [5, 4, 3] and data["older_versions"] == 2


async def test_a_diff_of_versions_that_share_few_lines_marks_whole_lines(settings: Settings) -> None:
    """A red-team finding: ndiff compared changed lines character by character, quadratic in their number (two
    2,000-line versions took 18 s) and on the event loop, so one read-only key's diff stalled every client."""
    old = {f"line-{n:05d}": f"old text {n}" for n in range(1900)}
    new = {**{f"line-{n:05d}": f"new text {n}" for n in range(1900)}, "line-01500": "old text 1500"}
    async with mcp_http(settings) as (http, service):
        await service.write(WRITER, WriteRequest("team-a/big", "config", old))
        await service.write(WRITER, WriteRequest("team-a/big", "config", new))
        diff = (await get(http, "diff", READER, path="team-a/big", key="config", **{"from": 1, "to": 2})).json()
        ops = [line["op"] for line in diff["lines"]]
        assert ops.count("remove") == ops.count("add") == 1899 and ops.count("same") == 3  # braces and line 1500
        removed = {line["text"].strip() for line in diff["lines"] if line["op"] == "remove"}
        assert '"line-00007": "old text 7",' in removed and '"line-01500": "old text 1500",' not in removed
        assert diff["coarse"] is False


async def test_a_diff_past_its_line_budget_keeps_the_shared_ends_and_shows_the_middle_removed_and_added(
        settings: Settings) -> None:
    """A red-team finding (0.7.15): `SequenceMatcher` is quadratic too; two 16,000-line versions that swap neighbouring
    lines took 40 s each, and eight at once held every client's store calls for minutes. Past DIFF_LINES changed lines
    the middle is not matched line by line, and the page says so."""
    old = [f"item {n}" for n in range(2 * api_module.DIFF_LINES)]
    new = [old[n ^ 1] for n in range(len(old))] + ["last"]
    async with mcp_http(settings) as (http, service):
        await service.write(WRITER, WriteRequest("team-a/big", "list", old))
        await service.write(WRITER, WriteRequest("team-a/big", "list", new))
        diff = (await get(http, "diff", READER, path="team-a/big", key="list", **{"from": 1, "to": 2})).json()
    assert diff["coarse"] is True
    ops = [line["op"] for line in diff["lines"]]
    assert ops[0] == "same" and ops[-1] == "same"  # the brackets
    assert ops.count("remove") == len(old) and ops.count("add") == len(new)
    assert [line["text"] for line in diff["lines"] if line["op"] in ("same", "remove")] == \
        json.dumps(old, indent=2).splitlines()
    assert [line["text"] for line in diff["lines"] if line["op"] in ("same", "add")] == \
        json.dumps(new, indent=2).splitlines()


async def test_outcomes_are_paged_in_the_store_and_an_entry_page_counts_the_older_ones(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A red-team finding: the outcome views read every outcome under the path (20,000: 3.5 s for one row, and an
    entry page of 5.6 MB with every outcome of the entry)."""
    monkeypatch.setattr(api_module, "ENTRY_PAGE_OUTCOMES", 1)
    async with mcp_http(settings) as (http, _):
        page = (await get(http, "outcomes", READER, offset=1, limit=1)).json()
        assert (page["total"], [o["outcome_ref"] for o in page["outcomes"]]) == (2, ["deploy-1"])
        entry = (await get(http, "entry", READER, path="team-b/search", key="index")).json()
        assert [o["outcome_ref"] for o in entry["outcomes"]] == ["incident-2"] and entry["older_outcomes"] == 1
        only_in_scope = (await get(http, "outcomes", TEAM_A)).json()
        assert only_in_scope["total"] == 1 and [o["outcome_ref"] for o in only_in_scope["outcomes"]] == ["deploy-1"]


@pytest.mark.parametrize("value", [" 1", "1_0", "\uff11", "\u0661", "+1", "1.0"])
async def test_a_page_number_is_plain_ascii_digits(settings: Settings, value: str) -> None:
    async with mcp_http(settings) as (http, _):
        refused = await get(http, "outcomes", READER, offset=value)
        assert refused.status_code == 400 and "digits 0-9" in refused.json()["error"]


async def test_search_runs_retrieval_with_explain_and_outcomes_list_newest_first(settings: Settings) -> None:
    async with mcp_http(settings) as (http, _):
        found = (await get(http, "search", q="search index rebuild")).json()
        top = found["results"][0]
        assert top["entry"]["entry_key"] == "team-b/search/index"
        assert top["strategies"]["keyword"]["rank"] == 1 and top["strategies"]["keyword"]["contribution"] > 0
        assert (await get(http, "search", q="   ")).status_code == 400
        outcomes = (await get(http, "outcomes")).json()
        assert [o["outcome_ref"] for o in outcomes["outcomes"]] == ["incident-2", "deploy-1"]
        deploy = outcomes["outcomes"][1]
        assert {e["entry_key"] for e in deploy["effects"]} == {"team-a/payments/retry-policy", "team-b/search/index"}


async def test_looking_through_the_ui_is_not_an_agent_read(settings: Settings) -> None:
    async with mcp_http(settings) as (http, service):
        traces_before = await service.store.trace_events()
        before = await service.peek("team-b/search", "index")
        await get(http, "entry", path="team-b/search", key="index")
        await get(http, "entries", path="team-b/search")
        assert (await get(http, "search", q="search index")).json()["results"]
        after = await service.peek("team-b/search", "index")
        assert after.recall_count == before.recall_count
        assert await service.store.trace_events() == traces_before
        assert await service.store.session_reads("ui") == []


async def test_a_read_only_key_reads_but_cannot_forget(settings: Settings) -> None:
    async with mcp_http(settings) as (http, service):
        me = (await get(http, "whoami", READER)).json()
        assert (me["access"], me["can_forget"]) == ("ro", False)
        assert (await get(http, "entry", READER, path="team-a/payments", key="timeout")).status_code == 200
        refused = await forget(http, READER, "team-a/payments", "timeout")
        assert refused.status_code == 403 and "read-only" in refused.json()["error"]
        assert (await service.peek("team-a/payments", "timeout")).key == "timeout"


async def test_a_read_write_key_forgets_an_entry_and_bad_requests_change_nothing(settings: Settings) -> None:
    async with mcp_http(settings) as (http, service):
        plain = await http.post(
            "/ui/api/forget", content='{"entity_path": "team-a/payments", "key": "timeout"}',
            headers={**bearer(ADMIN), "Content-Type": "text/plain"},
        )
        assert plain.status_code == 400
        assert (await http.get("/ui/api/forget", headers=bearer(ADMIN))).status_code == 405
        assert (await forget(http, ADMIN, "", "timeout")).status_code == 400
        assert (await service.peek("team-a/payments", "timeout")).key == "timeout"
        done = await forget(http, ADMIN, "team-a/payments", "timeout")
        assert done.json() == {"forgotten": "team-a/payments/timeout", "versions_removed": 1}
        assert (await get(http, "entry", path="team-a/payments", key="timeout")).status_code == 404
        assert (await forget(http, ADMIN, "team-a/payments", "timeout")).status_code == 404


@pytest.mark.parametrize("transport", ["http", "sse"])
async def test_a_forget_body_is_small_flat_json_naming_each_field_once(settings: Settings, transport: str) -> None:
    """A red-team finding: a 200 MB body was read whole (+600 MB), a deeply nested one answered 500 with a
    traceback, and on `serve` the MCP endpoint's JSON-RPC checks answered the page's requests in JSON-RPC."""
    headers = {**bearer(ADMIN), "Content-Type": "application/json"}
    async with mcp_http(settings, transport=transport) as (http, service):
        big = json.dumps({"entity_path": "team-a/payments", "key": "timeout", "pad": "x" * 100_000})
        assert (await http.post("/ui/api/forget", content=big, headers=headers)).status_code == 413
        deep = await http.post("/ui/api/forget", content="[" * 30_000 + "]" * 30_000, headers=headers)
        assert deep.status_code == 400 and "nested too deeply" in deep.json()["error"]
        twice = await http.post(
            "/ui/api/forget", headers=headers,
            content='{"entity_path": "team-a/payments", "key": "retry-policy", "key": "timeout"}',
        )
        assert twice.status_code == 400 and "'key' more than once" in twice.json()["error"]
        batch = await http.post("/ui/api/forget", content="[]", headers=headers)
        assert batch.status_code == 400 and "JSON object" in batch.json()["error"]
        for key in ("timeout", "retry-policy"):
            assert (await service.peek("team-a/payments", key)).key == key


async def test_with_keys_the_learning_view_shows_the_keys_own_preferences_only(settings: Settings) -> None:
    """A red-team finding: any unscoped key, read-only too, read every user's preferences in the learning view,
    though `amfs_get_preferences` gives each key its own."""
    keys = parse_api_keys(KEYS)
    admin, reader = (next(k for k in keys if k.secret == secret) for secret in (ADMIN, READER))
    service = build_service(settings)
    learning = build_learning_service(settings)
    app = create_ui_app(UiServices(service, learning, None), keys)
    async with app.router.lifespan_context(app):
        await learning.set_preference(admin.agent_id, "deploy", "target_account", "acct-A-private")
        await learning.set_preference(reader.agent_id, "style", "indent", 4)
        async with httpx2.AsyncClient(transport=StreamingASGITransport(app), base_url=BASE) as http:
            mine = (await get(http, "learning", READER)).json()["preferences"]
            assert [(p["category"], p["key"]) for p in mine] == [("style", "indent")]
            assert "acct-A-private" not in (await get(http, "learning", READER)).text
            assert [p["key"] for p in (await get(http, "learning", ADMIN)).json()["preferences"]] == ["target_account"]
    local = create_ui_app(UiServices(build_service(settings), build_learning_service(settings), None))
    async with local.router.lifespan_context(local):
        async with httpx2.AsyncClient(transport=StreamingASGITransport(local), base_url=BASE) as http:
            every = (await http.get("/ui/api/learning")).json()["preferences"]
            assert sorted(p["key"] for p in every) == ["indent", "target_account"]  # no keys: the local user sees all


async def test_a_prefix_key_sees_and_touches_only_its_prefix(settings: Settings) -> None:
    async with mcp_http(settings) as (http, service):
        me = (await get(http, "whoami", TEAM_A)).json()
        assert me["entity_prefix"] == "team-a"
        tree = (await get(http, "tree", TEAM_A)).json()
        assert (tree["path"], tree["total"]) == ("team-a", 3)
        assert "team-b" not in str(tree)
        for path, params in [
            ("tree", {"path": "team-b"}), ("entries", {"path": "team-b/search"}),
            ("entry", {"path": "team-b/search", "key": "index"}), ("search", {"q": "search index", "path": "team-b"}),
            ("outcomes", {"path": "team-b"}), ("tree", {"path": "team-ab"}),
            ("diff", {"path": "team-b/search", "key": "index", "from": 1, "to": 1}), ("learning", {}), ("ml", {}),
        ]:
            response = await get(http, path, TEAM_A, **params)
            assert response.status_code == 403, (path, params)
            assert "nightly" not in response.text
        found = (await get(http, "search", TEAM_A, q="search index rebuilds nightly payments")).json()
        assert found["results"] and all(r["entry"]["entity_path"].startswith("team-a") for r in found["results"])
        outcomes = (await get(http, "outcomes", TEAM_A)).json()
        assert [o["outcome_ref"] for o in outcomes["outcomes"]] == ["deploy-1"]
        assert [e["entry_key"] for e in outcomes["outcomes"][0]["effects"]] == ["team-a/payments/retry-policy"]
        refused = await forget(http, TEAM_A, "team-b/search", "index")
        assert refused.status_code == 403
        assert (await service.peek("team-b/search", "index")).key == "index"
        assert (await forget(http, TEAM_A, "team-a/payments/eu", "provider")).status_code == 200


async def test_the_ui_shares_the_mcp_endpoint_origin_and_host_checks(settings: Settings) -> None:
    async with mcp_http(settings) as (http, _):
        evil = await http.get("/ui/api/whoami", headers={**bearer(ADMIN), "Origin": "https://evil.example"})
        assert evil.status_code == 403
        rebound = await http.get("/ui/", headers={"Host": "evil.example"})
        assert rebound.status_code == 421 and rebound.headers["x-content-type-options"] == "nosniff"
        assert (await http.get("/ui/", headers={"Host": "evil.example@127.0.0.1"})).status_code == 421
        same_origin = await http.get("/ui/api/whoami", headers={**bearer(ADMIN), "Origin": "http://127.0.0.1:8000"})
        assert same_origin.status_code == 200


async def test_learning_and_ml_views_report_what_the_services_hold(settings: Settings) -> None:
    async with mcp_http(settings) as (http, _):
        learning = (await get(http, "learning")).json()
        assert learning["enabled"] is True and learning["preferences"] == []
        ml = (await get(http, "ml")).json()
        assert ml["ranker_models"] == [] and ml["learned_strategy_on"] is False
        assert ml["calibration_applied"] is False and ml["multipliers_in_force"] == ml["configured_multipliers"]
        calibration = await get(http, "ml/calibration")
        assert calibration.status_code == 409 and calibration.json()["insufficient_data"] is True


async def test_the_standalone_ui_app_serves_the_local_store_without_keys_on_loopback(settings: Settings) -> None:
    service = build_service(settings)
    app = create_ui_app(UiServices(service, None, MLService(service, settings.ml_dir / "exports")))
    async with app.router.lifespan_context(app):
        await seed(service)
        async with httpx2.AsyncClient(transport=StreamingASGITransport(app), base_url=BASE) as http:
            assert (await http.get("/")).headers["location"] == "/ui/"
            me = (await http.get("/ui/api/whoami")).json()
            assert (me["keyed"], me["access"], me["learning"]) == (False, "rw", False)
            assert (await http.get("/ui/api/tree")).json()["total"] == 5
            assert (await http.get("/ui/api/learning")).json()["enabled"] is False
            assert (await http.get("/ui/api/whoami", headers={"Origin": "https://evil.example"})).status_code == 403
            assert (await http.get("/ui/api/whoami", headers={"Host": "evil.example"})).status_code == 421


def test_the_ui_command_refuses_to_bind_beyond_loopback_without_keys(settings: Settings) -> None:
    from amfs_server.server.ui import run_ui

    with pytest.raises(SystemExit) as refused:
        run_ui(settings, host="0.0.0.0", port=1)
    assert "beyond loopback requires bearer-token auth" in str(refused.value.code)


def test_the_ui_command_serves_the_configured_store_with_its_keys(tmp_path: Path) -> None:
    import asyncio

    import httpx

    from amfs_server.session_bench.mcp_latency import server_env, spawn_http_server

    async def write() -> None:
        service = build_service(load_settings({}, data_dir=tmp_path, embedder="none"))
        await service.open()
        try:
            await seed(service)
        finally:
            await service.close()

    asyncio.run(write())
    env = server_env(tmp_path, AMFS_EMBEDDER="none", AMFS_API_KEYS=f"{ADMIN},{READER}:ro")
    server = spawn_http_server("http", env, command=["ui"],
                               program=[sys.executable, str(Path(__file__).with_name("default_install.py"))])
    try:
        with httpx.Client(base_url=server.base_url, timeout=30) as http:
            assert http.get("/ui/").status_code == 200
            assert http.get("/ui/api/tree").status_code == 401
            assert http.get("/ui/api/tree", headers=bearer(READER)).json()["total"] == 5
            assert http.get("/mcp").status_code == 404  # the page only: MCP stays with the stdio server
    finally:
        server.stop()
