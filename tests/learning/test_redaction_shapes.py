"""Redaction, table-driven: every credential shape the README lists is caught, and ordinary text
(words, paths, ids of entries, commands without secrets) is kept as it was."""

from __future__ import annotations

import pytest

from amfs_server.core.redaction import REDACTED, contains_redaction, looks_secret, redact

# (shape, input, what redact must return)
CAUGHT = [
    ("url, empty user", "redis://:PASSWORD@cache:6379/0", REDACTED),
    ("url, user and password", "postgresql://admin:hunter2@db:5432/prod", REDACTED),
    ("url, amqp", "amqp://guest:guest@rabbit//", REDACTED),
    ("query api_key", "https://api.example.com/v1/items?api_key=abc123", REDACTED),
    ("query token", "https://example.com/cb?code=1&access_token=zzz", REDACTED),
    ("query sig", "https://bucket.s3.amazonaws.com/f?X-Amz-Signature=0a1b2c", REDACTED),
    ("connection string Password=", "Server=db;Database=app;User Id=sa;Password=hunter2;", REDACTED),
    ("connection string Pwd=", "Driver={SQL};Server=db;Uid=sa;Pwd=s3cr3t;", REDACTED),
    ("env assignment", "DB_PASSWORD=hunter2 ./run.sh", REDACTED),
    ("yaml line", "password: hunter2", REDACTED),
    ("cli --password=", "psql --password=hunter2 -h db", REDACTED),
    ("cli --token=", "gh auth login --token=abcd", REDACTED),
    ("mysql -p", "mysql -u root -phunter2 app", REDACTED),
    ("mysqldump -p", "mysqldump -uroot -ps3cret app > dump.sql", REDACTED),
    ("curl -u", "curl -u admin:hunter2 https://example.com", REDACTED),
    ("Authorization: token", "Authorization: token ghxyz", REDACTED),
    ("Authorization: Bearer", "authorization: Bearer abc.def", REDACTED),
    ("Basic auth", "Basic dXNlcjpwYXNzd29yZA==", REDACTED),
    ("Basic auth, no digits", "Basic dXNlcjpwYXNz", REDACTED),
    ("Bearer token", "Bearer abc123def456", REDACTED),
    ("short sk-", "sk-abc123", REDACTED),
    ("long sk-", "sk-proj-Abc123def456GHI789jkl012MNO345", REDACTED),
    ("short ghp_", "ghp_a1b2c3d4", REDACTED),
    ("gho_", "gho_16C7e42F292c6912E7710c838347Ae178B4a", REDACTED),
    ("stripe", "sk_live_4eC39HqLyjWDarjtT1zdp7dc", REDACTED),
    ("aws key id", "AKIAIOSFODNN7EXAMPLE", REDACTED),
    ("slack", "xoxb-123456789012-abcdefghij", REDACTED),
    ("jwt", "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.abcdefGHIJ", REDACTED),
    ("pem", "-----BEGIN RSA PRIVATE KEY-----\nMIIE...", REDACTED),
    ("random key", "Zx9Qm2Lp7Rt4Vw8Ky3Nb6Hc1Jd5Fg0SaUe", REDACTED),
    ("name passcode", {"passcode": "1234"}, {"passcode": REDACTED}),
    ("name pin", {"pin": 4321}, {"pin": REDACTED}),
    ("name pin with a zero-width space", {"p\u200bin": 4321}, {"p\u200bin": REDACTED}),
    ("name db_pw", {"db_pw": "x"}, {"db_pw": REDACTED}),
    ("name otp", {"otp_code": "123456"}, {"otp_code": REDACTED}),
    ("name password, nested", {"config": {"password": "x"}}, {"config": {"password": REDACTED}}),
    ("argv --token", ["deploy", "--token", "abc", "--verbose"], ["deploy", "--token", REDACTED, "--verbose"]),
    ("argv --password", ["psql", "--password", "hunter2"], ["psql", "--password", REDACTED]),
    ("argv -api-key", ["-api-key", "k"], ["-api-key", REDACTED]),
    ("sk- as dict key", {"sk-abcdef123456": "gpt-4"}, {f"{REDACTED}#0": REDACTED}),
    ("ghp_ as dict key", {"x": 1, "ghp_abcdef1234567890": True}, {"x": 1, f"{REDACTED}#1": REDACTED}),
    ("secret in a list item", ["ok", "redis://:pw@h"], ["ok", REDACTED]),
    # quoted names: a JSON body or a Python dict literal passed as a string is dropped as a whole
    ("json string, password", '{"user": "bob", "password": "hunter2"}', REDACTED),
    ("json string, number pin", '{"pin": 1234}', REDACTED),
    ("json string, space before colon", '{"password" : "hunter2"}', REDACTED),
    ("json array string", '[{"id": 1}, {"access_token": "abc"}]', REDACTED),
    ("json string escaped twice", '{"body": "{\\"password\\": \\"hunter2\\"}"}', REDACTED),
    ("python dict literal", "{'api_key': 'hunter2'}", REDACTED),
    ("json in a nested parameter", {"request": {"body": '{"secret": "s"}'}}, {"request": {"body": REDACTED}}),
    # argv lists: mysql's glued -pPASS, curl's -u/--user user:password, --password=
    ("argv mysql -pPASS", ["mysql", "-u", "root", "-phunter2", "prod"], ["mysql", "-u", "root", REDACTED, "prod"]),
    ("argv mysqldump by path", ["/usr/bin/mysqldump", "-uroot", "-phunter2", "db"],
     ["/usr/bin/mysqldump", "-uroot", REDACTED, "db"]),
    ("argv mariadb after docker exec", ["docker", "exec", "db", "mariadb", "-phunter2"],
     ["docker", "exec", "db", "mariadb", REDACTED]),
    ("argv curl -u", ["curl", "-u", "admin:hunter2", "https://x"], ["curl", "-u", REDACTED, "https://x"]),
    ("argv curl --user", ["curl", "--user", "admin:hunter2"], ["curl", "--user", REDACTED]),
    ("argv curl --user=", ["curl", "--user=admin:hunter2"], ["curl", REDACTED]),
    ("argv curl -u glued", ["curl", "-uadmin:hunter2"], ["curl", REDACTED]),
    ("argv --password=", ["mysql", "--password=hunter2"], ["mysql", REDACTED]),
    ("cli --user", "curl --user admin:hunter2 https://x", REDACTED),
]

KEPT = [
    ("plain word", "retry"),
    ("sentence", "the token validation failed on Safari"),
    ("basic prose", "basic functionality works"),
    ("sk-learn", "pip install sk-learn"),
    ("scikit", "scikit-learn"),
    ("uuid of an entry", "123e4567-e89b-12d3-a456-426614174000"),
    ("entry key", "checkout-service/retry-pattern"),
    ("git sha", "a94a8fe5ccb19ba61c4c0873d391e987982fbbd3"),
    ("file path", "src/components/HeaderNavigation/index.tsx"),
    ("plain url", "https://example.com/docs?page=2&lang=en"),
    ("url with user only", "ssh://git@github.com/org/repo.git"),
    ("mkdir -p", "mkdir -p /tmp/build"),
    ("ssh -p", "ssh -p 2222 host"),
    ("mysql without password", "mysql -u root app"),
    ("time", "meeting at 10:30"),
    ("key: value prose", "note: retry later"),
    ("email-like", "alice@example.com"),
    ("pinned", "pinned dependency versions"),
    ("spinner", {"spinner": "dots"}),
    ("author", {"author": "alice"}),
    ("max_tokens", {"max_tokens": 512}),
    ("argv without secrets", ["pytest", "-q", "--maxfail", "1"]),
    ("number", 42),
    # near misses of the shapes above
    ("json without secret names", '{"user": "bob", "max_tokens": 512, "author": "a"}'),
    ("json, empty password", '{"user": "bob", "password": ""}'),
    ("json, null password", '{"password": null}'),
    ("dict literal without secret names", "{'limit': 10, 'sort': 'asc'}"),
    ("argv mkdir -p", ["mkdir", "-p", "dir"]),
    ("argv mkdir -pv", ["mkdir", "-pv", "dir"]),
    ("argv pytest -p", ["python", "-m", "pytest", "-p", "no:cacheprovider"]),
    ("pytest -p string", "python -m pytest -p no:cacheprovider"),
    ("argv git log -p", ["git", "log", "-p"]),
    ("argv ssh -p", ["ssh", "-p", "2222", "host"]),
    ("argv mysql -p prompts", ["mysql", "-u", "root", "-p", "prod"]),
    ("argv mysql -P port", ["mysql", "-P3306", "-h", "db"]),
    ("mysql -P port string", "mysql -P3306 -h db app"),
    ("argv curl -u without colon", ["curl", "-u", "alice", "https://x"]),
    ("argv docker -u uid:gid", ["docker", "run", "-u", "1000:1000", "img"]),
    ("docker -u uid:gid string", "docker run -u 1000:1000 img"),
    ("pip -U", "pip install -U pkg:extra"),
]


@pytest.mark.parametrize(("shape", "value", "expected"), CAUGHT, ids=[c[0] for c in CAUGHT])
def test_credential_shapes_are_redacted(shape: str, value: object, expected: object) -> None:
    assert redact(value) == expected
    assert contains_redaction(redact(value))


@pytest.mark.parametrize(("shape", "value"), KEPT, ids=[k[0] for k in KEPT])
def test_ordinary_values_are_kept_as_they_were(shape: str, value: object) -> None:
    assert redact(value) == value
    if isinstance(value, str):
        assert not looks_secret(value)


def test_the_table_covers_at_least_forty_shapes() -> None:
    assert len(CAUGHT) + len(KEPT) >= 40 and len(CAUGHT) >= 30


@pytest.mark.parametrize(
    "filler",
    ["x", "x=", "a:", "x-", "x.", "1-", "a@b.", "mysql ", "-u a", "Basic ", "Bearer ", "redis://", "sk-", "ghp_",
     "--token ", '"a": ', '\\"a\\": ', "--user ", "-p"],
)
def test_redaction_of_a_long_string_takes_linear_time(filler: str) -> None:
    import time

    text = filler * (200_000 // len(filler))
    started = time.perf_counter()
    redact(text, anonymize=True)
    assert time.perf_counter() - started < 5.0  # quadratic scanning took minutes on 200 KB (generous: shared box)


async def test_the_record_tool_names_every_redacted_parameter_and_stores_none_of_them(tmp_path) -> None:
    from fastmcp import Client, FastMCP

    from amfs_server.adapters.sqlite_learning import SQLiteLearningStore
    from amfs_server.core.learning import LearningConfig, LearningService
    from amfs_server.tools import ActorResolver
    from amfs_server.tools.learning_tools import register_learning_tools

    learning = LearningService(SQLiteLearningStore(tmp_path / "learning.db"), LearningConfig())
    mcp = FastMCP("redaction-test")
    register_learning_tools(mcp, learning, ActorResolver("agent/test"))
    parameters = {
        "body": '{"user": "bob", "password": "hunter2-json"}',
        "kwargs": "{'api_key': 'hunter2-pydict'}",
        "argv": ["mysql", "-u", "root", "-phunter2-mysql", "prod"],
        "curl": ["curl", "-u", "admin:hunter2-curl", "https://x"],
        "plain": '{"limit": 10}',
    }
    async with Client(mcp) as client:
        reported = (await client.call_tool(
            "amfs_record_interaction", {"tool_name": "http_post", "parameters": parameters}
        )).structured_content
    (interaction,) = await learning.interactions()
    await learning.close()
    assert reported["redacted"] == ["body", "kwargs", "argv[3]", "curl[2]"]
    assert interaction.parameters["plain"] == '{"limit": 10}'
    stored = b"".join(path.read_bytes() for path in tmp_path.iterdir() if path.name.startswith("learning"))
    assert b"hunter2" not in stored


def test_a_long_string_is_searched_only_where_it_can_be_kept_and_a_credential_across_the_cut_is_still_caught() -> None:
    """A red-team finding: the credential patterns ran over all 3.9 MB of one parameter (2.7 s on the event loop)
    though only its first 1,000 characters are kept."""
    from amfs_server.core.redaction import MAX_STRING_CHARS, REDACTED, redact

    crossing = "x" * (MAX_STRING_CHARS - 4) + " password=hunter2-very-secret"  # starts before the cut, ends after
    assert redact(crossing) == REDACTED
    long = "word " * 300 + "k=v " * 1_000_000 + "password=hunter2-very-secret"  # the credential is cut away
    kept = redact(long)
    assert kept.startswith("word word") and kept.endswith(f"[TRUNCATED: {len(long)} chars]")
    assert "hunter2" not in kept and len(kept) < MAX_STRING_CHARS + 40
