"""What the red team's findings now get: outcome refs scoped per key prefix, identity from the key, exports
confined to a scoped key's prefix and folder. HTTP is driven in process through the real ASGI app."""

from __future__ import annotations

import json
from pathlib import Path

from fastmcp import Client
from mcp_types import Implementation

from amfs_server.core.models import Actor
from amfs_server.core.service import MemoryService, WriteRequest
from amfs_server.server.settings import Settings

from .test_auth import ADMIN, KEYS, TEAM_A, call, http_app, mcp_client

TEAM_B = "team-b-key-000000000000005"
OTHER = "other-user-key-00000000006"
ALL_KEYS = f"{KEYS},{TEAM_B}:rw@team-b,{OTHER}"


# -- outcome refs (finding 4) -------------------------------------------------------------------


async def test_outcome_refs_of_two_scopes_never_meet_and_unscoped_refs_stay_global(service: MemoryService) -> None:
    seed = Actor("seed", "seed")
    await service.write_many(seed, [WriteRequest("team-a", "x", 1), WriteRequest("team-b", "y", 2)])
    team_a, team_b = Actor("a", "sa", scope="team-a"), Actor("b", "sb", scope="team-b")

    first = await service.commit_outcome(team_a, "INC-1", "failure", ["team-a/x"])
    assert first.outcome_ref == "INC-1" and not first.already_applied
    # team-b's outcome with the same ref applies to its own entry and learns nothing about team-a's
    second = await service.commit_outcome(team_b, "INC-1", "failure", ["team-b/y"])
    assert not second.already_applied and [e.entry_key for e in second.effects] == ["team-b/y"]
    again = await service.commit_outcome(team_b, "INC-1", "failure", ["team-b/y"])
    assert again.already_applied and [e.entry_key for e in again.effects] == ["team-b/y"]

    # unscoped callers keep one global namespace, and can name a scope's ref in full
    admin = Actor("admin", "s0")
    assert not (await service.commit_outcome(admin, "INC-1", "success", ["team-a/x"])).already_applied
    assert (await service.commit_outcome(admin, "@team-a#INC-1", "failure", ["team-a/x"])).already_applied
    refs = sorted(r.outcome_ref for r in await service.outcome_records())
    assert refs == ["@team-a#INC-1", "@team-b#INC-1", "INC-1"]


async def test_a_ref_an_unscoped_key_filed_in_a_scope_does_not_reveal_entries_outside_it(
    service: MemoryService,
) -> None:
    seed = Actor("seed", "seed")
    await service.write_many(seed, [WriteRequest("team-a", "x", 1), WriteRequest("team-b", "y", 2)])
    await service.commit_outcome(Actor("admin", "s0"), "@team-a#INC-2", "failure", ["team-a/x", "team-b/y"])
    seen = await service.commit_outcome(Actor("a", "sa", scope="team-a"), "INC-2", "failure", ["team-a/x"])
    assert seen.already_applied and [e.entry_key for e in seen.effects] == ["team-a/x"]


async def test_prefix_keys_reusing_another_teams_outcome_ref_over_http_apply_their_own(settings: Settings) -> None:
    async with http_app(settings, ALL_KEYS) as asgi:
        await call(asgi, ADMIN, "amfs_write", {"entity_path": "team-a", "key": "x", "value": 1})
        await call(asgi, ADMIN, "amfs_write", {"entity_path": "team-b", "key": "y", "value": 2})
        outcome = {"outcome_ref": "deploy-7", "outcome_type": "failure"}
        a = await call(asgi, TEAM_A, "amfs_commit_outcome", outcome | {"causal_entry_keys": ["team-a/x"]})
        b = await call(asgi, TEAM_B, "amfs_commit_outcome", outcome | {"causal_entry_keys": ["team-b/y"]})
        assert a.structured_content["outcome_ref"] == b.structured_content["outcome_ref"] == "deploy-7"
        assert b.structured_content["already_applied"] is False
        assert [e["entry_key"] for e in b.structured_content["updated"]] == ["team-b/y"]
        history = await call(asgi, ADMIN, "amfs_history", {"entity_path": "team-b", "key": "y"})
        assert history.structured_content["versions"][0]["confidence"] > 0.5  # the failure raised it


# -- identity (finding 5) -----------------------------------------------------------------------


def named_client(asgi: object, token: str, name: str) -> Client:
    client = mcp_client(asgi, token)
    client._client_info = Implementation(name=name, version="1")  # what a hostile client would claim
    return client


async def test_with_api_keys_the_user_is_the_key_not_the_name_the_client_claims(settings: Settings) -> None:
    async with http_app(settings, ALL_KEYS) as asgi:
        async with named_client(asgi, ADMIN, "alice") as alice:
            await alice.call_tool("amfs_set_preference", {"category": "style", "key": "tabs", "value": "spaces"})
            own = await alice.call_tool("amfs_get_preferences", {"min_confidence": 0})
            assert [p["key"] for p in own.structured_content["preferences"]] == ["tabs"]
        async with named_client(asgi, OTHER, "alice") as impostor:
            stolen = await impostor.call_tool("amfs_get_preferences", {"min_confidence": 0})
            assert stolen.structured_content["preferences"] == []
            await impostor.call_tool("amfs_set_preference", {"category": "style", "key": "tabs", "value": "tabs"})
        async with named_client(asgi, ADMIN, "bob") as admin_again:  # a new name does not change who the key is
            prefs = (await admin_again.call_tool("amfs_get_preferences", {"min_confidence": 0})).structured_content
            assert [p["value"] for p in prefs["preferences"]] == ["spaces"]


async def test_a_key_file_can_name_the_identity_a_key_acts_as(settings: Settings, tmp_path: Path) -> None:
    from amfs_server.server.auth import parse_api_keys

    path = tmp_path / "keys.json"
    path.write_text(json.dumps([{"key": ADMIN, "agent": "ci-bot"}, {"key": OTHER}]))
    keys = parse_api_keys(f"@{path}")
    assert [k.agent_id for k in keys] == ["ci-bot", keys[1].key_id]
    assert keys[1].key_id.startswith("key-") and OTHER not in keys[1].key_id


# -- training export under a prefix key (findings 1 and 6) ----------------------------------------


async def test_a_prefix_key_exports_only_its_own_teams_data_into_its_own_folder(settings: Settings) -> None:
    from amfs_server.server.composition import build_service

    seeding = build_service(settings)  # one session that read both teams' entries, on the store the server opens
    await seeding.open()
    seed, session = Actor("seed", "seed"), Actor("agent", "mixed")
    await seeding.write_many(seed, [
        WriteRequest("team-a", "x", "a-x"), WriteRequest("team-a", "y", "a-y"), WriteRequest("team-b", "s", "b-secret"),
    ])
    for path, key in [("team-a", "x"), ("team-a", "y"), ("team-b", "s")]:
        await seeding.read(session, path, key)
    await seeding.write(session, WriteRequest("team-a", "decision", "use x"))
    await seeding.commit_outcome(session, "OK-1", "success", ["team-a/x", "team-a/y", "team-b/s"])
    await seeding.close()

    async with http_app(settings, ALL_KEYS) as asgi:
        admin = await call(asgi, ADMIN, "amfs_export_training_data", {"format": "sft", "entity_path": "team-a"})
        scoped = await call(asgi, TEAM_A, "amfs_export_training_data", {"format": "sft"})
        assert "a-x" in json.dumps(scoped.structured_content) and "b-secret" not in json.dumps(scoped.structured_content)
        assert "b-secret" not in json.dumps(admin.structured_content)  # the filter is the boundary for everyone
        written = [
            (await call(asgi, token, "amfs_export_training_data", {"format": "sft", "output_path": "t.jsonl"}))
            .structured_content["output_path"]
            for token in (TEAM_A, ADMIN)
        ]
    assert len(set(written)) == 2 and all(Path(p).name == "t.jsonl" for p in written)
    assert "b-secret" not in Path(written[0]).read_text()
