"""Redaction: what learning may keep of a tool call's parameters, applied before anything is stored.

Two rules, applied recursively over dicts and lists:

* a value whose parameter (or nested key) name says it is a credential (`password`, `api_key`,
  `access_token`, `Authorization`, `cookie`, `client_secret`, `passcode`, `pin`, `db_pw`, ...) becomes
  `[REDACTED]`, whatever it is; so does the item after a flag with such a name in a list
  (`["--token", X]`), the item after `-u`/`--user` when it is `user:password` (`["curl", "-u", "a:pw"]`)
  and a glued `-pPASS` item after a mysql-family program (`["mysql", "-phunter2"]`);
* a string that looks like a credential on its own (provider key prefixes such as `sk-`, `ghp_`,
  `AKIA`, `xoxb-`; `Bearer ...`, `Basic <user:pass>`, `Authorization: ...`; JWTs; PEM private keys;
  URLs with a password, even with an empty user; `name=value` where the name is a secret's name, as in
  `Password=` in connection strings, `?api_key=` in URLs or `--password=`, and quoted names as in a
  JSON body or a Python dict literal passed as a string, `{"password": "x"}`; `mysql -pPASS`; `curl -u
  user:pass`; long high-entropy tokens) becomes `[REDACTED]` as a whole, wherever it appears. A dict
  key that looks like a credential is replaced too.

Then long strings are cut (a prompt or a file pasted into a parameter is not a preference) and, with
`anonymize`, e-mail addresses are masked. Redaction runs on the full string before it is cut, so a
secret is never half-kept. Export and import run stored data through it again.
"""

from __future__ import annotations

import base64
import hashlib
import math
import re
import unicodedata
from collections import Counter
from collections.abc import Mapping
from typing import Any

REDACTED = "[REDACTED]"
EMAIL_MASK = "[EMAIL]"
MAX_STRING_CHARS = 1000
"""Longer strings are cut to this and marked; the redaction check sees what is kept and SECRET_MARGIN more."""
SECRET_MARGIN = 4096  # past a string's cut, how far a credential starting before it is still looked for (a PEM key)
MAX_DEPTH = 8
"""Deeper structures are replaced by a marker: nothing below is stored unchecked."""
MAX_ITEMS = 100
"""Lists and dicts keep their first MAX_ITEMS items (a bulk payload is not a preference)."""

# Whole words / compounds in a parameter name that mean "this is a credential". Matched on the name
# split into words (snake, kebab, camel case), so `author`, `max_tokens` and `passage` stay visible.
_SECRET_WORDS = frozenset({
    "pass", "passwd", "password", "passphrase", "pwd", "secret", "token", "auth", "authorization", "oauth",
    "credential", "credentials", "cookie", "cookies", "apikey", "jwt", "bearer", "privatekey", "sessionkey",
    "passcode", "pin", "pincode", "pw", "otp", "totp", "sig", "signature",
})
_SECRET_PAIRS = frozenset({
    ("api", "key"), ("private", "key"), ("session", "key"), ("access", "key"), ("secret", "key"),
    ("ssh", "key"), ("signing", "key"), ("encryption", "key"), ("client", "secret"), ("set", "cookie"),
})
# Substrings of the name with separators removed: long and specific enough to never be innocent.
_SECRET_COMPOUNDS = ("password", "passwd", "passphrase", "secret", "apikey", "privatekey", "accesskey", "credential")

_SECRET_VALUE = re.compile(
    r"""
      \bsk-(?=[A-Za-z0-9_-]{0,80}[0-9])[A-Za-z0-9_-]{6,} # OpenAI / Anthropic style keys, short ones too (not sk-learn)
    | \b(?:sk|rk|pk)_(?:live|test)_[A-Za-z0-9]{16,} # Stripe
    | \bgh[pousr]_[A-Za-z0-9]{6,}                  # GitHub tokens
    | \bgithub_pat_[A-Za-z0-9_]{20,}
    | \bglpat-[A-Za-z0-9_-]{20,}                   # GitLab
    | \b(?:AKIA|ASIA)[0-9A-Z]{16}\b                # AWS access key ids
    | \bxox[abposr]-[A-Za-z0-9-]{10,}              # Slack
    | \bxapp-[A-Za-z0-9-]{10,}
    | \bAIza[0-9A-Za-z_-]{35}                      # Google API keys
    | \bnpm_[A-Za-z0-9]{36}
    | \beyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}  # JWTs
    """,
    re.VERBOSE,
)
# Case-insensitive shapes. A header scheme counts only when what follows has a digit or a symbol, so
# prose ("basic functionality") stays visible.
_SECRET_VALUE_ANY_CASE = re.compile(
    r"""
      \b(?:bearer|basic)\s+(?=[A-Za-z0-9._~+/=-]{0,200}[0-9._~+/=])[A-Za-z0-9._~+/=-]{8,}
    | -----BEGIN\ [A-Z0-9 ]*PRIVATE\ KEY-----       # PEM private keys
    | \b[a-z][a-z0-9+.-]{0,30}://[^\s/:@]*:[^\s/@]+@     # URLs carrying user:password@ (redis://:pw@host too)
    | \b(?:proxy-)?authorization\s*:\s*\S+         # an HTTP Authorization header, whatever its scheme
    | \b(?:mysql|mysqldump|mysqladmin|mariadb)\b[^\n]{0,200}?\s(?-i:-p)(?![\s-])\S+  # mysql -pPASS (-P is the port)
    | (?:^|\s)(?-i:-u\s*|--user[\s=]\s*)(?!\d+:\d+(?!\S))[^\s:]+:\S+  # curl -u user:pass, not -u uid:gid
    """,
    re.IGNORECASE | re.VERBOSE,
)
# name=value (connection strings, query strings, command-line flags) and name:value: the name decides.
# The name starts where a word starts and is bounded, so a long run of letters costs linear time. It may be
# quoted (JSON, a dict literal, JSON escaped once more: `"password": ...`, `\\"password\\": ...`); null and
# booleans are no secret, and an empty value ("") never matches.
_NAMED_VALUE = re.compile(
    r"""(?<![A-Za-z0-9_.])([A-Za-z][A-Za-z0-9_.-]{0,63})(?:\\?["']\s*)?(?:\s*=\s*|:(?!//)\s*)"""
    r"""(?!(?:null|None|true|false|True|False)\b)("[^"]+"|'[^']+'|[^\s;&,"']+)"""
)
_BASIC_CREDENTIALS = re.compile(r"\bbasic\s+([A-Za-z0-9+/]{4,}={0,2})", re.IGNORECASE)
_FLAG = re.compile(r"--?[A-Za-z][A-Za-z0-9_-]*")
# Programs whose `-pPASS` (glued) is the password; elsewhere -p means other things (mkdir -p, pytest -p).
_GLUED_P_PROGRAM = re.compile(r"(?:.*[/\\])?(?:mysql[a-z]*|mariadb(?:-[a-z]+)?)(?:\.exe)?", re.IGNORECASE | re.DOTALL)
_GLUED_P_PASSWORD = re.compile(r"-p[^\s-].*", re.DOTALL)  # -p alone prompts; -P (capital) is the port
_USER_PASSWORD = re.compile(r"(?!\d+:\d+$)[^:\s]+:.+", re.DOTALL)  # user:password; 1000:1000 is uid:gid
_TOKEN_RUN = re.compile(r"[A-Za-z0-9+/=_-]{32,}")
_EMAIL = re.compile(r"\b[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9.-]{1,253}\.[A-Za-z]{2,63}\b")  # bounded: linear time
_CAMEL = re.compile(r"([a-z0-9])([A-Z])")
HIGH_ENTROPY_BITS = 4.2
"""Shannon entropy per character above which a 32+ character token counts as random. Hex digests
(git SHAs, at most 4.0 bits) and words stay visible; random base64/alphanumeric keys (~5 bits) do not."""


def name_words(name: str) -> list[str]:
    return [word for word in re.split(r"[^a-z0-9]+", _CAMEL.sub(r"\1_\2", name).lower()) if word]


def is_secret_name(name: str) -> bool:
    """Whether a parameter or field name says its value is a credential. Invisible formatting characters (a
    zero-width space in `p\u200bin`) are dropped first: they would otherwise split the name into harmless words."""
    words = name_words("".join(char for char in name if unicodedata.category(char) != "Cf"))
    if any(word in _SECRET_WORDS for word in words):
        return True
    if any(pair in _SECRET_PAIRS for pair in zip(words, words[1:])):
        return True
    compact = "".join(words)
    return any(part in compact for part in _SECRET_COMPOUNDS)


def _entropy(text: str) -> float:
    counts = Counter(text)
    return -sum(n / len(text) * math.log2(n / len(text)) for n in counts.values())


def _is_basic_credentials(encoded: str) -> bool:
    try:
        decoded = base64.b64decode(encoded, validate=True).decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        return False
    return ":" in decoded and decoded.isprintable()


def looks_secret(text: str) -> bool:
    """Whether a string looks like a credential by its shape alone."""
    if _SECRET_VALUE.search(text) or _SECRET_VALUE_ANY_CASE.search(text):
        return True
    if any(is_secret_name(match.group(1)) for match in _NAMED_VALUE.finditer(text)):
        return True
    if any(_is_basic_credentials(match.group(1)) for match in _BASIC_CREDENTIALS.finditer(text)):
        return True
    for match in _TOKEN_RUN.finditer(text):
        token = match.group()
        has_digit = any(c.isdigit() for c in token)
        has_alpha = any(c.isalpha() for c in token)
        if has_digit and has_alpha and _entropy(token) >= HIGH_ENTROPY_BITS:
            return True
    return False


def redact(value: Any, *, anonymize: bool = False, max_string: int = MAX_STRING_CHARS) -> Any:
    """A JSON-safe copy of `value` with credentials replaced by `[REDACTED]` (see the module docstring)."""
    return _redact(value, anonymize, max_string, 0)


def _redact(value: Any, anonymize: bool, max_string: int, depth: int) -> Any:
    if depth > MAX_DEPTH:
        return "[TRUNCATED: nested too deep]"
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, str):
        # Only what can be kept is looked at, with a margin for a credential or address that starts in the kept part
        # and runs past the cut: matching a 3.9 MB string took 2.7 s on the event loop (red-team finding, 0.7.10).
        seen = value[:max_string + SECRET_MARGIN]
        if looks_secret(seen):
            return REDACTED
        if anonymize:
            seen = _EMAIL.sub(EMAIL_MASK, seen)
        if len(value) > max_string:
            return f"{seen[:max_string]}…[TRUNCATED: {len(value)} chars]"
        return seen
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for index, (key, item) in enumerate(value.items()):
            if index >= MAX_ITEMS:
                out["…"] = f"[TRUNCATED: {len(value)} keys]"
                break
            name = str(key)
            if looks_secret(name):  # a credential used as a key: neither key nor value is kept
                out[f"{REDACTED}#{index}"] = REDACTED
                continue
            out[name] = REDACTED if is_secret_name(name) else _redact(item, anonymize, max_string, depth + 1)
        return out
    if isinstance(value, list | tuple | set | frozenset):
        items = list(value)
        kept = []
        after_glued_p_program = False  # argv: a mysql-family program seen earlier in this list
        for index, item in enumerate(items[:MAX_ITEMS]):
            secret = index > 0 and _is_secret_argument(items[index - 1], item)
            if after_glued_p_program and isinstance(item, str) and _GLUED_P_PASSWORD.fullmatch(item):
                secret = True
            kept.append(REDACTED if secret else _redact(item, anonymize, max_string, depth + 1))
            if isinstance(item, str) and _GLUED_P_PROGRAM.fullmatch(item):
                after_glued_p_program = True
        if len(items) > MAX_ITEMS:
            kept.append(f"[TRUNCATED: {len(items)} items]")
        return kept
    if isinstance(value, bytes | bytearray):
        return f"[BINARY: {len(value)} bytes]"
    return _redact(str(value), anonymize, max_string, depth)


def _is_secret_flag(item: Any) -> bool:
    """`--token`, `-password`, `--api-key`: the list item after it is the secret (argv style)."""
    return isinstance(item, str) and bool(_FLAG.fullmatch(item)) and is_secret_name(item.lstrip("-"))


def _is_secret_argument(flag: Any, item: Any) -> bool:
    """Whether argv item `item`, following `flag`, is a secret: `--token X`, or curl's `-u user:password`."""
    if _is_secret_flag(flag):
        return True
    return flag in ("-u", "--user") and isinstance(item, str) and bool(_USER_PASSWORD.fullmatch(item))


def contains_redaction(value: Any) -> bool:
    """Whether redaction touched anything in `value` (such a value is never learned as a preference)."""
    if isinstance(value, str):
        return value == REDACTED or "[TRUNCATED" in value or EMAIL_MASK in value
    if isinstance(value, Mapping):
        return any(contains_redaction(item) for item in value.values())
    if isinstance(value, list):
        return any(contains_redaction(item) for item in value)
    return False


def redacted_paths(original: Any, redacted: Any, prefix: str = "") -> list[str]:
    """Dotted paths of the values that redaction replaced, so a caller can be told what was dropped."""
    if redacted == REDACTED and original != REDACTED:
        return [prefix or "(value)"]
    paths: list[str] = []
    if isinstance(original, Mapping) and isinstance(redacted, Mapping):
        for key, item in original.items():
            if str(key) in redacted:
                paths += redacted_paths(item, redacted[str(key)], f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(original, list | tuple) and isinstance(redacted, list):
        for index, (item, kept) in enumerate(zip(original, redacted)):
            paths += redacted_paths(item, kept, f"{prefix}[{index}]")
    return paths


def pseudonym(identifier: str) -> str:
    """A stable pseudonym for a user or session id (`privacy.anonymize`): the same id always maps to
    the same pseudonym, so preferences and workflows still group, but the id itself is not stored."""
    return "anon-" + hashlib.sha256(f"amfs-learning:{identifier}".encode()).hexdigest()[:16]
