"""HTTP/SSE access control: API keys (AMFS_API_KEYS), their scopes, and the Origin/Host guard.

AMFS_API_KEYS is a comma-separated list of `KEY` or `KEY:SCOPE` entries, or `@/path/keys.json`
(a JSON list of `{"key": "...", "scope": "...", "agent": "..."}` objects). SCOPE is `rw` (the default), `ro`,
`rw@ENTITY/PREFIX` or `ro@ENTITY/PREFIX`:

    AMFS_API_KEYS="s3cret-admin-key-0001,ci-readonly-key-0002:ro,team-a-key-00000003:rw@team-a"

A key is 16+ characters of `A-Z a-z 0-9 . _ ~ + / = -`. `ro` keys may call only tools annotated
read-only; a prefix-scoped key may touch only entries at or under its prefix. Who calls is the key,
not what the client says: the agent id (whose preferences and patterns the learning tools use) is
the entry's `agent`, else the key's id (`key-<hash>`). stdio is a local, trusted transport: keys apply
to SSE and streamable HTTP only.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from ipaddress import ip_address
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from fastmcp.exceptions import ToolError
from fastmcp.server.auth import AccessToken, TokenVerifier
from fastmcp.server.dependencies import get_access_token
from fastmcp.server.middleware import CallNext, Middleware, MiddlewareContext
from starlette.datastructures import Headers
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from ..core import validation as v
from ..core.errors import ValidationError
from ..tools._params import list_from_text
from ..tools._registry import shown_name
from .limits import CallLimiter, ServerLimits

Access = Literal["ro", "rw"]
MIN_KEY_LENGTH = 16
_KEY_CHARS = re.compile(r"[A-Za-z0-9._~+/=-]+")
_ACCESS_CLAIM = "amfs_access"
_PREFIX_CLAIM = "amfs_entity_prefix"
_AGENT_CLAIM = "amfs_agent"


@dataclass(frozen=True)
class ApiKey:
    secret: str
    access: Access = "rw"
    entity_prefix: str | None = None
    agent: str | None = None

    @property
    def key_id(self) -> str:
        """A stable name for logs and session scoping that does not reveal the key."""
        return "key-" + hashlib.sha256(self.secret.encode()).hexdigest()[:12]

    @property
    def agent_id(self) -> str:
        """The identity calls with this key act as: configured, else the key's id. Never the client's say-so."""
        return self.agent or self.key_id

    def allows(self, entity_path: Any) -> bool:
        if self.entity_prefix is None:
            return True
        return isinstance(entity_path, str) and (
            entity_path == self.entity_prefix or entity_path.startswith(self.entity_prefix + "/")
        )


def _parse_scope(scope: str, where: str) -> tuple[Access, str | None]:
    access, at, prefix = scope.partition("@")
    if access != "ro" and access != "rw":
        raise ValidationError(f"{where}: scope {scope!r} must be rw, ro, rw@ENTITY/PREFIX or ro@ENTITY/PREFIX.")
    if not at:
        return access, None
    try:
        return access, v.validate_entity_path(prefix)
    except ValidationError as error:
        raise ValidationError(f"{where}: {error}") from None


def _make_key(secret: str, scope: str | None, where: str, agent: str | None = None) -> ApiKey:
    if len(secret) < MIN_KEY_LENGTH or not _KEY_CHARS.fullmatch(secret):
        raise ValidationError(
            f"{where}: a key must be at least {MIN_KEY_LENGTH} characters of A-Z a-z 0-9 . _ ~ + / = - "
            "(generate one with: python -c 'import secrets; print(secrets.token_urlsafe(32))')."
        )
    access, prefix = _parse_scope(scope or "rw", where)
    if agent is not None:
        try:
            agent = v.validate_key(agent)  # the same plain, bounded name as a memory key
        except ValidationError as error:
            raise ValidationError(f"{where}: agent: {error}") from None
    return ApiKey(secret, access, prefix, agent)


def parse_api_keys(text: str | None) -> list[ApiKey]:
    """Parse AMFS_API_KEYS (format in the module docstring). Errors name the entry, never the key."""
    if text is None or not text.strip():
        return []
    text = text.strip()
    keys: list[ApiKey] = []
    if text.startswith("@"):
        path = Path(text[1:]).expanduser()
        try:
            items = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise ValidationError(
                f"AMFS_API_KEYS file {path}: cannot read it as JSON ({type(error).__name__})."
            ) from None
        if not isinstance(items, list) or not all(isinstance(i, dict) and isinstance(i.get("key"), str) for i in items):
            raise ValidationError(
                f'AMFS_API_KEYS file {path}: expected a JSON list of {{"key": "...", "scope": "rw"}}.'
            )
        for n, item in enumerate(items, start=1):
            scope, agent = item.get("scope"), item.get("agent")
            if scope is not None and not isinstance(scope, str):
                raise ValidationError(f"AMFS_API_KEYS file {path}, entry {n}: scope must be a string.")
            if agent is not None and not isinstance(agent, str):
                raise ValidationError(f"AMFS_API_KEYS file {path}, entry {n}: agent must be a string.")
            keys.append(_make_key(item["key"], scope, f"AMFS_API_KEYS file {path}, entry {n}", agent))
    else:
        for n, entry in enumerate((e.strip() for e in text.split(",")), start=1):
            if entry:
                secret, _, scope = entry.partition(":")
                keys.append(_make_key(secret, scope or None, f"AMFS_API_KEYS entry {n}"))
    if len({key.secret for key in keys}) != len(keys):
        raise ValidationError("AMFS_API_KEYS lists the same key twice.")
    return keys


class ApiKeyVerifier(TokenVerifier):
    """Bearer-token check for SSE and streamable HTTP: a missing or unknown key gets HTTP 401."""

    def __init__(self, keys: Sequence[ApiKey]) -> None:
        super().__init__()
        self._keys = list(keys)

    async def verify_token(self, token: str) -> AccessToken | None:
        match = None
        for key in self._keys:  # compare against every key: timing does not reveal which one matched
            if hmac.compare_digest(key.secret.encode(), token.encode()):
                match = key
        if match is None:
            return None
        return AccessToken(
            token=token,
            client_id=match.key_id,
            scopes=["amfs:read"] if match.access == "ro" else ["amfs:read", "amfs:write"],
            claims={_ACCESS_CLAIM: match.access, _PREFIX_CLAIM: match.entity_prefix, _AGENT_CLAIM: match.agent},
        )


def current_key() -> ApiKey | None:
    """The API key of the current HTTP request; None on stdio, in-memory, or a server without keys."""
    token = get_access_token()
    if token is None or _ACCESS_CLAIM not in token.claims:
        return None
    return ApiKey(
        token.token, token.claims[_ACCESS_CLAIM], token.claims.get(_PREFIX_CLAIM), token.claims.get(_AGENT_CLAIM)
    )


class KeyScopeMiddleware(Middleware):
    """Refuses tool calls outside the caller's key scope before the tool runs, so nothing is written.

    Write tools are those not annotated read-only (so later tools are covered by their annotations).
    A prefix-scoped key: `entity_path` must lie under the prefix (a filter left out becomes the
    prefix); `causal_entry_keys` must be given and lie under it; other tools act on the whole store
    and are refused. Each key also gets a bounded number of calls in progress, and every result
    (any transport) a size cap (`limits.CallLimiter`).
    """

    def __init__(self, limiter: CallLimiter | None = None) -> None:
        self.limiter = limiter or CallLimiter(ServerLimits())

    async def on_call_tool(self, context: MiddlewareContext[Any], call_next: CallNext[Any, Any]) -> Any:
        key = current_key()
        name = context.message.name
        if key is None or context.fastmcp_context is None:
            result = await call_next(context)
        else:
            context = await self._within_scope(context, key)
            async with self.limiter.slot(key.key_id):
                result = await call_next(context)
        self.limiter.check_response_size(name, result)
        return result

    async def _within_scope(self, context: MiddlewareContext[Any], key: ApiKey) -> MiddlewareContext[Any]:
        name = context.message.name
        tool = await context.fastmcp_context.fastmcp.get_tool(name)  # type: ignore[union-attr]
        if tool is None:
            return context
        read_only = bool(tool.annotations and tool.annotations.read_only_hint)
        if key.access == "ro" and not read_only:
            raise ToolError(f"{name} writes, and this API key is read-only. Nothing was written; use a read-write key.")
        if key.entity_prefix is None:
            return context
        arguments = _restrict_to_prefix(name, tool.parameters.get("properties", {}), context.message.arguments, key,
                                        read_only)
        return context.copy(message=context.message.model_copy(update={"arguments": arguments}))


def _restrict_to_prefix(
    name: str, properties: dict[str, Any], arguments: dict[str, Any] | None, key: ApiKey, read_only: bool
) -> dict:
    prefix = key.entity_prefix
    arguments = dict(arguments or {})
    refusal = (f"This API key is limited to entity_path '{prefix}' and what lies under it; "
               f"{'nothing was read' if read_only else 'nothing was written'}.")
    if "entity_path" not in properties and "causal_entry_keys" not in properties:
        raise ToolError(f"{name} acts on the whole store. {refusal}")
    if "entity_path" in properties:
        if arguments.get("entity_path") is None:
            arguments["entity_path"] = prefix
        elif not isinstance(arguments["entity_path"], str):
            pass  # not a path at all: the tool's own validation refuses it for its type, not its scope
        elif not key.allows(arguments["entity_path"]):
            raise ToolError(f"{name}: entity_path {shown_name(arguments['entity_path'])} is out of scope. {refusal}")
    if "causal_entry_keys" in properties:
        # The same leniency as the tool's own parameter (a JSON-encoded list, or one key as a string), so the
        # scope is checked on the keys the tool will act on.
        entry_keys = list_from_text(arguments.get("causal_entry_keys") or [])
        if not isinstance(entry_keys, list):
            return arguments  # not a list even so: the tool's own validation refuses it
        if not entry_keys:
            raise ToolError(f"{name}: pass causal_entry_keys (entries under '{prefix}'). {refusal}")
        if not all(isinstance(k, str) for k in entry_keys):
            return arguments  # the tool's own validation refuses a key that is not a string
        outside = [k for k in entry_keys if not key.allows(k.rpartition("/")[0])]
        if outside:
            shown = ", ".join(shown_name(k) for k in outside[:3])
            raise ToolError(f"{name}: causal_entry_keys [{shown}] are out of scope. {refusal}")
    return arguments


# -- Origin / Host guard ----------------------------------------------------------------------


def is_loopback(host: str) -> bool:
    host = host.strip().strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ip_address(host).is_loopback
    except ValueError:
        return False


def _normalize_origin(origin: str) -> str | None:
    try:
        parts = urlsplit(origin.strip())
        port = parts.port
    except ValueError:
        return None
    if not parts.scheme or not parts.hostname:
        return None
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{parts.scheme.lower()}://{host.lower()}" + (f":{port}" if port else "")


def parse_allowed_origins(text: str | None) -> list[str]:
    """AMFS_ALLOWED_ORIGINS: comma-separated origins such as `https://app.example.com`."""
    origins = []
    for item in (text or "").split(","):
        if item.strip():
            normalized = _normalize_origin(item)
            if normalized is None:
                raise ValidationError(
                    f"AMFS_ALLOWED_ORIGINS: {item.strip()!r} is not an origin like https://host[:port]."
                )
            origins.append(normalized)
    return origins


class OriginGuard:
    """DNS-rebinding protection, as the MCP spec asks of HTTP servers.

    A request whose Origin is neither loopback nor listed in AMFS_ALLOWED_ORIGINS gets 403. On a
    loopback bind the Host header must name a loopback host too (421 otherwise): a rebound page sends
    no Origin on same-origin GETs, but it cannot fake Host.
    """

    def __init__(self, app: ASGIApp, allowed_origins: Sequence[str] = (), loopback_bind: bool = True) -> None:
        self.app = app
        self.allowed_origins = frozenset(allowed_origins)
        self.loopback_bind = loopback_bind

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = Headers(scope=scope)
            origin = headers.get("origin")
            if origin is not None and not self._origin_allowed(origin):
                response = PlainTextResponse(
                    f"Forbidden: Origin {origin!r} is not allowed. Add it to AMFS_ALLOWED_ORIGINS to permit it.", 403,
                    headers={"X-Content-Type-Options": "nosniff"},
                )
                await response(scope, receive, send)
                return
            host = headers.get("host", "")
            # A Host holds no user part: "evil.example@127.0.0.1" would otherwise parse as loopback.
            if self.loopback_bind and ("@" in host or not is_loopback(urlsplit(f"//{host}").hostname or "")):
                response = PlainTextResponse(f"Misdirected request: Host {host!r} is not this server.", 421,
                                             headers={"X-Content-Type-Options": "nosniff"})
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _origin_allowed(self, origin: str) -> bool:
        normalized = _normalize_origin(origin)
        if normalized is None:  # "null" (sandboxed pages, file://) and garbage
            return False
        return is_loopback(urlsplit(normalized).hostname or "") or normalized in self.allowed_origins
