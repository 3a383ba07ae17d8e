"""The confidence curve, action levels, preference transitions and redaction: pure functions, no store."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from amfs_server.core.errors import ValidationError
from amfs_server.core.learning import Thresholds, corrected, observed, preference_confidence
from amfs_server.core.redaction import (
    REDACTED,
    contains_redaction,
    is_secret_name,
    looks_secret,
    pseudonym,
    redact,
    redacted_paths,
)

NOW = datetime(2026, 3, 2, 9, 0, tzinfo=timezone.utc)

PLANTED_SECRETS = [
    "sk-proj-Abc123def456GHI789jkl012MNO345",
    "sk-ant-api03-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789",
    "ghp_1A2b3C4d5E6f7G8h9I0jK1lM2nO3pQ4rS5tU",
    "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz",
    "AKIAIOSFODNN7EXAMPLE",
    "xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx",
    "Bearer eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ\n-----END OPENSSH PRIVATE KEY-----",
    "postgresql://admin:hunter2hunter2@db.internal:5432/prod",
    "Zx9Qm2Lp7Rt4Vw8Ky3Nb6Hc1Jd5Fg0SaUe",  # an unprefixed random key
]


# -- the confidence curve and action levels ----------------------------------------------------


def test_confidence_curve_gives_the_documents_values() -> None:
    assert preference_confidence(0) == 0.0
    assert preference_confidence(1) == pytest.approx(0.4)  # after one correction
    assert round(preference_confidence(5), 2) in (0.85, 0.86)  # after 5 consistent uses
    assert preference_confidence(4) < 0.8 < preference_confidence(5)  # 5 uses cross auto-apply
    assert round(preference_confidence(10), 2) == 0.98  # after 10
    assert all(preference_confidence(n) < preference_confidence(n + 1) < 1 for n in range(1, 30))


def test_action_levels_follow_the_documents_table_and_thresholds_are_configurable() -> None:
    levels = Thresholds()
    assert [levels.action_for(c) for c in (0.0, 0.29, 0.3, 0.59, 0.6, 0.79, 0.8, 1.0)] == [
        "none", "none", "suggest", "suggest", "confirm", "confirm", "auto_apply", "auto_apply"
    ]
    strict = Thresholds(suggest=0.5, confirm=0.9, auto_apply=0.99)
    assert strict.action_for(preference_confidence(5)) == "suggest"
    with pytest.raises(ValidationError, match="suggest <= confirm <= auto_apply"):
        Thresholds(suggest=0.7, confirm=0.6, auto_apply=0.8)


def test_consistent_observations_raise_confidence_and_a_correction_resets_it_to_the_new_value() -> None:
    preference = None
    for _ in range(5):
        preference = observed(preference, "u", "format_code", "style", "pep8", NOW)
    assert (preference.value, preference.support, preference.sample_size) == ("pep8", 5, 5)
    assert preference.confidence > 0.8
    fixed = corrected(preference, "u", "format_code", "style", "black", NOW)
    assert (fixed.value, fixed.confidence, fixed.support, fixed.source) == ("black", pytest.approx(0.4), 1, "corrected")
    assert fixed.sample_size == 6
    restated = corrected(fixed, "u", "format_code", "style", "black", NOW)
    assert restated.support == 2 and restated.confidence == pytest.approx(0.58)


def test_contradicting_observations_halve_support_and_values_that_always_change_never_get_confidence() -> None:
    preference = None
    for _ in range(10):
        preference = observed(preference, "u", "t", "k", 120, NOW)
    preference = observed(preference, "u", "t", "k", 88, NOW)
    assert (preference.value, preference.support) == (120, 5)
    noisy = None
    for n in range(12):
        noisy = observed(noisy, "u", "github_create_issue", "title", f"title {n}", NOW)
    assert noisy.confidence == 0.0 and noisy.sample_size == 12


# -- redaction ---------------------------------------------------------------------------------


@pytest.mark.parametrize("secret", PLANTED_SECRETS)
def test_values_that_look_like_credentials_are_redacted_wherever_they_are(secret: str) -> None:
    assert looks_secret(secret)
    cleaned = redact({"query": secret, "nested": {"list": ["ok", f"token is {secret}"]}})
    assert cleaned == {"query": REDACTED, "nested": {"list": ["ok", REDACTED]}}
    assert secret not in repr(cleaned)


@pytest.mark.parametrize("name", [
    "password", "passwd", "db_password", "api_key", "apiKey", "x-api-key", "API-KEY", "secret", "client_secret",
    "token", "access_token", "refreshToken", "auth", "Authorization", "oauth_token", "credentials", "private_key",
    "privateKey", "session_key", "cookie", "Set-Cookie", "aws_secret_access_key",
])
def test_parameters_named_like_credentials_are_redacted_whatever_their_value(name: str) -> None:
    assert is_secret_name(name)
    assert redact({name: "plain", "headers": {name: 12345}}) == {name: REDACTED, "headers": {name: REDACTED}}


@pytest.mark.parametrize("name", ["author", "max_tokens", "passage", "key", "entity_path", "keyword", "compass", "title"])
def test_ordinary_parameter_names_stay_visible(name: str) -> None:
    assert not is_secret_name(name)
    assert redact({name: "value"}) == {name: "value"}


@pytest.mark.parametrize("text", [
    "basic functionality works", "the token validation failed", "a94a8fe5ccb19ba61c4c0873d391e987982fbbd3",
    "123e4567-e89b-12d3-a456-426614174000", "src/components/HeaderNavigation/index.tsx", "Fix login bug on Safari",
])
def test_ordinary_values_stay_visible(text: str) -> None:
    assert not looks_secret(text)
    assert redact(text) == text


def test_long_strings_are_cut_after_the_secret_check_and_odd_values_become_json_safe() -> None:
    long_text = "x" * 5000
    assert redact(long_text, max_string=100).startswith("x" * 100 + "…[TRUNCATED: 5000 chars]")
    assert redact("y" * 5000 + " " + PLANTED_SECRETS[0]) == REDACTED
    assert redact(b"\x00\x01") == "[BINARY: 2 bytes]"
    assert redact((1, float("nan"))) == [1, "nan"]
    assert contains_redaction(redact({"a": long_text}))


def test_redacted_paths_name_what_was_dropped_and_anonymize_masks_emails_and_pseudonymises_ids() -> None:
    original = {"title": "x", "token": "abc", "headers": {"Authorization": "Bearer abcdef123456"}}
    assert redacted_paths(original, redact(original)) == ["token", "headers.Authorization"]
    assert redact("mail ada@example.com", anonymize=True) == "mail [EMAIL]"
    assert redact("mail ada@example.com") == "mail ada@example.com"
    assert pseudonym("agent/alice") == pseudonym("agent/alice") != pseudonym("agent/bob")
    assert "alice" not in pseudonym("agent/alice")
