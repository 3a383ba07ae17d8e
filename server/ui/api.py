"""The memory browser's routes: the page, its static assets and a JSON API under `/ui/api/`.

Every API call needs the bearer key when the server has keys (the page keeps it in sessionStorage and
sends `Authorization: Bearer`); the page and its assets carry no data, so they load without one (a
browser cannot send a header on navigation). A read-only key reads; only a read-write key may forget.
A prefix key (`rw@team-a`) sees entries, counts, outcome effects and search results under its prefix
only, and none of the store-wide views (learning, ML), as over MCP. With keys the learning view shows the
key's own user's preferences and patterns (as `amfs_get_preferences` does); without keys, every user's.

Reads here are a person looking, not an agent reading: they use `MemoryService.peek`, `entries_at`,
`entity_counts`, `history`, `outcome_records` and `retrieve(count_as_read=False)`, so no recall count,
tier or decision trace changes and nothing links a UI read to a later outcome. All data comes through
the services' public methods.
"""

from __future__ import annotations

import asyncio
import difflib
import json
import sys
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from importlib import resources
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ...core import validation as v
from ...core.errors import AmfsError, InsufficientDataError, NotFoundError, ValidationError
from ...core.learning import LearningService
from ...core.models import Actor, MemoryEntry, OutcomeRecord, ValueHead, to_iso, utcnow
from ...core.service import MemoryService
from ...ml.service import MLService
from ..auth import Access, ApiKey, ApiKeyVerifier, OriginGuard, is_loopback

UI_PATH = "/ui"
_API = UI_PATH + "/api"
_UI_ACTOR = Actor("ui", "ui")  # never traced: UI searches pass count_as_read=False
MAX_PAGE = 200
# An entry page shows each older version's value up to this many characters of its JSON (the current one whole),
# so a key with many large versions cannot make one response as large as all of them together.
VERSION_VALUE_CHARS = 2000
SUMMARY_VALUE_HEAD = 160
"""The entry list's preview: the first 159 characters of a value's JSON, so longer values are read as heads."""
ENTRY_PAGE_VERSIONS = 200  # the newest versions an entry page shows; it says how many older ones it leaves out
ENTRY_PAGE_OUTCOMES = 200  # likewise the newest outcomes on the entry
MAX_FORGET_BODY = 64 * 1024  # a forget names one entry: a few hundred bytes
MAX_TREE_CHILDREN = 500

# No inline script or style, no eval, nothing from another origin; the SVG chart is built with DOM calls.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
_SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}
_STATIC_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8", ".css": "text/css"}


@dataclass(frozen=True)
class UiServices:
    service: MemoryService
    learning: LearningService | None
    ml: MLService | None


@dataclass(frozen=True)
class Viewer:
    """Who is looking: the key's access and prefix (full access on a server without keys)."""

    access: Access
    entity_prefix: str | None
    keyed: bool
    agent_id: str | None = None
    """The user the key acts as (whose preferences and patterns it sees); None on a server without keys."""

    def allows(self, entity_path: str) -> bool:
        return ApiKey("", self.access, self.entity_prefix).allows(entity_path)


class _Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    body = json.dumps(data, ensure_ascii=False, default=str).encode()
    return Response(body, status, {**_SECURITY_HEADERS, **(headers or {})}, media_type="application/json")


class _Auth:
    def __init__(self, keys: Sequence[ApiKey]) -> None:
        self._verifier = ApiKeyVerifier(keys) if keys else None
        self._by_id = {key.key_id: key for key in keys}

    async def viewer(self, request: Request) -> Viewer:
        if self._verifier is None:
            return Viewer("rw", None, keyed=False)
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        access = await self._verifier.verify_token(token.strip()) if scheme.lower() == "bearer" and token else None
        if access is None:
            raise _Refused(401, "This server needs an API key: send it as 'Authorization: Bearer <key>'.")
        key = self._by_id[access.client_id]
        return Viewer(key.access, key.entity_prefix, keyed=True, agent_id=key.agent_id)


Handler = Callable[[Request, Viewer], Awaitable[Any]]


def _endpoint(auth: _Auth, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        try:
            viewer = await auth.viewer(request)
            return _json(await handler(request, viewer))
        except _Refused as refusal:
            headers = {"WWW-Authenticate": "Bearer"} if refusal.status == 401 else None
            return _json({"error": str(refusal)}, refusal.status, headers)
        except NotFoundError as error:
            return _json({"error": str(error)}, 404)
        except InsufficientDataError as error:
            return _json({"error": str(error), "insufficient_data": True}, 409)
        except (AmfsError, ValueError) as error:
            return _json({"error": str(error)}, 400)
        except RecursionError:  # json.loads of a body nested thousands deep
            return _json({"error": "The body is nested too deeply; send a flat JSON object."}, 400)

    return endpoint


# -- request parameters -------------------------------------------------------------------------


def _int_param(request: Request, name: str, default: int, maximum: int) -> int:
    text = request.query_params.get(name)
    if text is None or text == "":
        return default
    if not (text.isascii() and text.isdigit()):  # int() would also take " 1", "1_0" and other scripts' digits
        raise ValidationError(f"{name} must be a whole number written with the digits 0-9, got {text!r}.")
    value = int(text)
    if not 0 <= value <= maximum:
        raise ValidationError(f"{name} must be between 0 and {maximum}, got {value}.")
    return value


def _scoped_path(viewer: Viewer, path: str | None) -> str | None:
    """The entity path to look under: the one asked for (which must be in scope), else the key's prefix."""
    if path is None or path == "":
        return viewer.entity_prefix
    path = v.validate_entity_path(path)
    if not viewer.allows(path):
        raise _Refused(403, f"entity_path {path!r} is outside this API key's scope ('{viewer.entity_prefix}').")
    return path


def _required(request: Request, name: str) -> str:
    value = request.query_params.get(name)
    if not value:
        raise ValidationError(f"Pass {name}=... in the query string.")
    return value


def _whole_store(viewer: Viewer, view: str) -> None:
    if viewer.entity_prefix is not None:
        raise _Refused(
            403, f"The {view} view covers the whole store; this API key is limited to '{viewer.entity_prefix}'."
        )


# -- views -----------------------------------------------------------------------------------------


def _summary(entry: MemoryEntry, service: MemoryService, now: Any) -> dict[str, Any]:
    value = (entry.value.json_head[:159] + "…" if isinstance(entry.value, ValueHead)  # read with SUMMARY_VALUE_HEAD
             else json.dumps(entry.value, ensure_ascii=False, default=str))
    return {
        "entity_path": entry.entity_path,
        "key": entry.key,
        "entry_key": entry.entry_key,
        "preview": value if len(value) <= 160 else value[:159] + "…",
        "version": entry.version,
        "confidence": entry.confidence,
        "effective_confidence": service.effective_confidence(entry, now),
        "tier": entry.tier.name.lower(),
        "memory_type": entry.memory_type.value,
        "written_at": to_iso(entry.provenance.written_at),
        "outcome_count": entry.outcome_count,
        "recall_count": entry.recall_count,
    }


def _detail(entry: MemoryEntry, service: MemoryService, now: Any) -> dict[str, Any]:
    data = entry.to_dict(include_embedding=False)
    data.pop("embedding", None)
    data.pop("passage_embeddings", None)
    data["tier_name"] = entry.tier.name.lower()
    data["effective_confidence"] = service.effective_confidence(entry, now)
    return data


def _version_row(entry: MemoryEntry, service: MemoryService, now: Any) -> dict[str, Any]:
    """`_detail` with the value cut to VERSION_VALUE_CHARS of its JSON (`value_truncated` says so)."""
    data = _detail(entry, service, now)
    text = json.dumps(entry.value, ensure_ascii=False, indent=2, sort_keys=True, default=str)
    data["value_truncated"] = len(text) > VERSION_VALUE_CHARS
    if data["value_truncated"]:
        data["value"] = f"{text[:VERSION_VALUE_CHARS]}…[{len(text)} characters; the diff shows all of it]"
    return data


def _scoped_record(record: OutcomeRecord, viewer: Viewer) -> dict[str, Any] | None:
    """The record with only the effects the viewer may see; None when it touched nothing in scope."""
    effects = [e.to_dict() for e in record.effects if viewer.allows(e.entity_path)]
    if not effects:
        return None
    data = record.to_dict()
    data["effects"] = effects
    return data


DIFF_LINES = 2_000
"""Changed lines per side past which a diff is coarse: `SequenceMatcher` is quadratic in them (two 16,000-line
versions that swap neighbouring lines took 40 s; at 2,000, 0.6 s)."""
# One diff at a time, beside the store's threads: eight parallel diffs in the default pool held every client's store
# calls for minutes (red-team finding, 0.7.15).
_DIFF_THREAD = ThreadPoolExecutor(max_workers=1, thread_name_prefix="amfs-ui-diff")


def _diff(old: Any, new: Any) -> dict[str, Any]:
    """Whole lines kept, removed and added (`lines`). Not `ndiff`: its character-level pass over changed lines is
    quadratic (two 2,000-line versions that share little took 18 s). Lines shared at the start and the end are kept
    as they are; between them, past DIFF_LINES changed lines on a side, the old lines are shown removed and the new
    ones added without matching them (`coarse`)."""
    def lines(value: Any) -> list[str]:
        return json.dumps(value, ensure_ascii=False, indent=2, sort_keys=True, default=str).splitlines()

    a, b = lines(old), lines(new)
    head = 0
    while head < min(len(a), len(b)) and a[head] == b[head]:
        head += 1
    tail = 0
    while tail < min(len(a), len(b)) - head and a[-1 - tail] == b[-1 - tail]:
        tail += 1
    middle_a, middle_b = a[head:len(a) - tail], b[head:len(b) - tail]
    coarse = max(len(middle_a), len(middle_b)) > DIFF_LINES
    out = [{"op": "same", "text": line} for line in a[:head]]
    opcodes = ([("replace", 0, len(middle_a), 0, len(middle_b))] if coarse
               else difflib.SequenceMatcher(None, middle_a, middle_b).get_opcodes())
    for op, a0, a1, b0, b1 in opcodes:
        if op == "equal":
            out += [{"op": "same", "text": line} for line in middle_a[a0:a1]]
            continue
        out += [{"op": "remove", "text": line} for line in middle_a[a0:a1]]
        out += [{"op": "add", "text": line} for line in middle_b[b0:b1]]
    out += [{"op": "same", "text": line} for line in a[len(a) - tail:]]
    return {"lines": out, "coarse": coarse}


async def _json_body(request: Request, limit: int) -> Any:
    """The request's JSON body, read no further than `limit` bytes (413 beyond); a key given twice is refused."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise _Refused(413, f"The body is larger than {limit} bytes; nothing was done.")

    def no_repeats(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        repeated = sorted(name for name, n in Counter(name for name, _ in pairs).items() if n > 1)
        if repeated:
            raise ValidationError(f"The body names {', '.join(map(repr, repeated))} more than once; nothing was done.")
        return dict(pairs)

    return json.loads(body, object_pairs_hook=no_repeats)


def _handlers(ui: UiServices) -> dict[str, Handler]:
    service = ui.service

    async def whoami(request: Request, viewer: Viewer) -> Any:
        return {
            "keyed": viewer.keyed,
            "access": viewer.access,
            "entity_prefix": viewer.entity_prefix,
            "can_forget": viewer.access == "rw",
            "learning": ui.learning is not None,
            "ml": ui.ml is not None,
            "decay_half_life_days": service.config.decay_half_life_days,
        }

    async def tree(request: Request, viewer: Viewer) -> Any:
        path = _scoped_path(viewer, request.query_params.get("path"))
        offset = _int_param(request, "offset", 0, 10**9)
        limit = _int_param(request, "limit", MAX_TREE_CHILDREN, MAX_TREE_CHILDREN)
        counts = await service.entity_counts(path)
        children: dict[str, dict[str, Any]] = {}
        for entity, n in counts.items():
            if entity == path:
                continue
            rest = entity[len(path) + 1:] if path else entity
            segment, slash, _ = rest.partition("/")
            child = f"{path}/{segment}" if path else segment
            node = children.setdefault(child, {"path": child, "name": segment, "total": 0, "here": 0, "has_children": False})
            node["total"] += n
            if slash:
                node["has_children"] = True
            else:
                node["here"] += n
        ordered = sorted(children.values(), key=lambda c: c["path"])
        return {
            "path": path,
            "here": counts.get(path, 0) if path else 0,
            "total": sum(counts.values()),
            "num_children": len(ordered),
            "children": ordered[offset: offset + limit],
            "offset": offset,
        }

    async def entries(request: Request, viewer: Viewer) -> Any:
        path = _scoped_path(viewer, _required(request, "path"))
        assert path is not None
        offset = _int_param(request, "offset", 0, 10**9)
        limit = _int_param(request, "limit", 50, MAX_PAGE)
        page = await service.entries_at(path, offset, limit, value_head=SUMMARY_VALUE_HEAD) if limit else []
        total = (await service.entity_counts(path)).get(path, 0)
        now = utcnow()
        return {"path": path, "offset": offset, "limit": limit, "total": total,
                "entries": [_summary(e, service, now) for e in page]}

    async def entry(request: Request, viewer: Viewer) -> Any:
        path = _scoped_path(viewer, _required(request, "path"))
        assert path is not None
        key = v.validate_key(_required(request, "key"))
        now = utcnow()
        current = await service.peek(path, key)
        page, older = await service.history_page(path, key, ENTRY_PAGE_VERSIONS)
        versions = [_version_row(version, service, now) async for version in page]
        records = await service.outcome_records(path, key=key, newest_first=True, limit=ENTRY_PAGE_OUTCOMES)
        older_outcomes = max(0, await service.count_outcomes(path, key=key) - len(records))
        outcomes = []
        for record in records:
            for effect in record.effects:
                if effect.entity_path == path and effect.key == key:
                    outcomes.append({
                        "outcome_ref": record.outcome_ref, "outcome_type": record.outcome_type.value,
                        "multiplier": record.multiplier, "committed_at": to_iso(record.committed_at),
                        "agent_id": record.agent_id, "version_read": effect.version_read,
                        "version_updated": effect.version_updated,
                        "confidence_before": effect.confidence_before, "confidence_after": effect.confidence_after,
                    })
        outcomes.sort(key=lambda o: o["committed_at"])
        return {
            "entry": _detail(current, service, now),
            "versions": versions[::-1],
            "older_versions": older,
            "outcomes": outcomes,
            "older_outcomes": older_outcomes,
            "decay_half_life_days": service.config.decay_half_life_days,
            "now": to_iso(now),
        }

    async def diff(request: Request, viewer: Viewer) -> Any:
        path = _scoped_path(viewer, _required(request, "path"))
        assert path is not None
        key = v.validate_key(_required(request, "key"))
        a, b = _int_param(request, "from", 0, 10**9), _int_param(request, "to", 0, 10**9)
        old, new = await service.peek_version(path, key, a), await service.peek_version(path, key, b)  # two, not all
        made = await asyncio.get_running_loop().run_in_executor(_DIFF_THREAD, _diff, old.value, new.value)
        return {"from": a, "to": b, **made}

    async def outcomes(request: Request, viewer: Viewer) -> Any:
        offset = _int_param(request, "offset", 0, 10**9)
        limit = _int_param(request, "limit", 50, MAX_PAGE)
        path = _scoped_path(viewer, request.query_params.get("path"))
        # Every record listed has an effect under `path`, which lies in the viewer's scope: none is dropped below.
        page = await service.outcome_records(path, newest_first=True, offset=offset, limit=limit)
        records = [r for r in (_scoped_record(r, viewer) for r in page) if r]
        return {"total": await service.count_outcomes(path), "offset": offset, "limit": limit, "outcomes": records}

    async def search(request: Request, viewer: Viewer) -> Any:
        query = request.query_params.get("q", "")
        path = _scoped_path(viewer, request.query_params.get("path"))
        limit = _int_param(request, "limit", 10, 100) or 10
        results = await service.retrieve(
            _UI_ACTOR, query, entity_path=path, limit=limit, explain=True, count_as_read=False, whole_values=False
        )
        now = utcnow()
        return {
            "query": query,
            "weights": service.retrieval_weights(),
            "results": [
                {
                    "rank": hit.rank,
                    "score": hit.score,
                    "entry": _summary(hit.entry, service, now),
                    "strategies": {name: s.to_dict() for name, s in (hit.strategies or {}).items()},
                }
                for hit in results
            ],
        }

    async def learning(request: Request, viewer: Viewer) -> Any:
        _whole_store(viewer, "learning")
        if ui.learning is None:
            return {"enabled": False, "preferences": [], "patterns": []}
        config = ui.learning.config
        user = viewer.agent_id  # with keys, a key sees its own user's, as over MCP; without keys, every user's
        preferences = await ui.learning.get_preferences(user) if config.preference_learning else []
        patterns = await ui.learning.patterns(user) if config.pattern_detection else []
        return {
            "enabled": True,
            "thresholds": {"suggest": config.thresholds.suggest, "confirm": config.thresholds.confirm,
                           "auto_apply": config.thresholds.auto_apply},
            "preferences": [{**p.to_dict(), "action": p.action} for p in preferences],
            "patterns": [{**p.to_dict(), "action": p.action, "description": p.describe()} for p in patterns],
        }

    async def ml(request: Request, viewer: Viewer) -> Any:
        _whole_store(viewer, "ML")
        metrics = [m.to_dict() for m in ui.ml.ranker.all_metrics()] if ui.ml is not None else []
        for m in metrics:
            m.pop("model_path", None)  # a server path: nothing a viewer can use
        in_force = {t.value: m for t, m in service.multipliers.items()}
        configured = {t.value: m for t, m in service.config.multipliers.items()}
        return {
            "ranker_models": metrics,
            "learned_strategy_on": service.learned_scorer is not None,
            "retrieval_weights": service.retrieval_weights(),
            "multipliers_in_force": in_force,
            "configured_multipliers": configured,
            "calibration_applied": in_force != configured,
            "decay_half_life_days": service.config.decay_half_life_days,
        }

    async def calibration(request: Request, viewer: Viewer) -> Any:
        _whole_store(viewer, "ML")
        if ui.ml is None:
            raise NotFoundError("ML is not available on this server.")
        report = await ui.ml.calibrate(per_entity=True, apply=False)  # a report only: applies nothing
        return report.to_dict()

    async def forget(request: Request, viewer: Viewer) -> Any:
        if viewer.access != "rw":
            raise _Refused(403, "This API key is read-only; nothing was forgotten. Use a read-write key.")
        if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
            raise ValidationError("Send the forget request as JSON (Content-Type: application/json).")
        try:
            body = await _json_body(request, MAX_FORGET_BODY)
        except ValidationError:
            raise
        except ValueError:
            raise ValidationError('The body must be JSON: {"entity_path": "...", "key": "..."}.') from None
        if not isinstance(body, dict):
            raise ValidationError('The body must be a JSON object: {"entity_path": "...", "key": "..."}.')
        path = body.get("entity_path")
        if not isinstance(path, str) or not path:
            raise ValidationError('Name the entry to forget: {"entity_path": "...", "key": "..."}.')
        path = _scoped_path(viewer, path)
        assert path is not None
        key = v.validate_key(body.get("key"))
        removed = await service.forget(path, key)
        return {"forgotten": f"{path}/{key}", "versions_removed": removed}

    return {
        "whoami": whoami, "tree": tree, "entries": entries, "entry": entry, "diff": diff,
        "outcomes": outcomes, "search": search, "learning": learning, "ml": ml,
        "ml/calibration": calibration, "forget": forget,
    }


# -- static files ----------------------------------------------------------------------------------


def _static_files() -> dict[str, tuple[bytes, str]]:
    folder = resources.files(__package__).joinpath("static")
    files = {}
    for item in folder.iterdir():
        suffix = "." + item.name.rpartition(".")[2]
        if item.is_file() and suffix in _STATIC_TYPES:
            files[item.name] = (item.read_bytes(), _STATIC_TYPES[suffix])
    return files


def ui_routes(ui: UiServices, keys: Sequence[ApiKey]) -> list[Route]:
    auth = _Auth(keys)
    files = _static_files()

    async def page(request: Request) -> Response:
        body, media_type = files["index.html"]
        return Response(body, headers=_SECURITY_HEADERS, media_type=media_type)

    async def static(request: Request) -> Response:
        found = files.get(request.path_params["name"])
        if found is None:
            return Response("Not found", 404, headers=_SECURITY_HEADERS, media_type="text/plain")
        return Response(found[0], headers=_SECURITY_HEADERS, media_type=found[1])

    routes = [
        Route(UI_PATH, page, methods=["GET"]),
        Route(UI_PATH + "/", page, methods=["GET"]),
        Route(UI_PATH + "/static/{name}", static, methods=["GET"]),
    ]
    for name, handler in _handlers(ui).items():
        routes.append(Route(f"{_API}/{name}", _endpoint(auth, handler), methods=["POST" if name == "forget" else "GET"]))
    return routes


def register_ui(mcp: Any, ui: UiServices, keys: Sequence[ApiKey]) -> None:
    """Serve the page from the FastMCP app's HTTP and SSE transports (stdio has no HTTP, so nothing changes)."""
    for route in ui_routes(ui, keys):
        mcp.custom_route(route.path, methods=sorted(route.methods or ["GET"]), include_in_schema=False)(route.endpoint)


def create_ui_app(
    ui: UiServices,
    keys: Sequence[ApiKey] = (),
    *,
    host: str = "127.0.0.1",
    allowed_origins: Sequence[str] = (),
    start_ml: bool = True,
) -> Starlette:
    """A standalone app serving only the page (`amfs-server ui`), opening and closing the services itself."""

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        await ui.service.open()
        ui.service.start_expiry_sweeps()
        if ui.ml is not None and start_ml:
            await ui.ml.start()
        if ui.learning is not None:
            await ui.learning.open()
        try:
            yield
        finally:
            if ui.learning is not None:
                await ui.learning.close()
            if ui.ml is not None and start_ml:
                await ui.ml.stop()
            await ui.service.close()

    async def home(request: Request) -> Response:
        return Response(status_code=307, headers={"Location": UI_PATH + "/"})

    return Starlette(
        routes=[Route("/", home, methods=["GET"]), *ui_routes(ui, keys)],
        middleware=[Middleware(OriginGuard, allowed_origins=allowed_origins, loopback_bind=is_loopback(host))],
        lifespan=lifespan,
    )


def run_ui(settings: Any, host: str = "127.0.0.1", port: int = 8765) -> None:
    """`amfs-server ui`: serve the page for the configured store. Refuses (SystemExit with the reason) to bind
    beyond loopback without API keys, as `serve` does."""
    import uvicorn

    from ..logs import configure_logging, uvicorn_log_config
    from ..auth import parse_allowed_origins, parse_api_keys
    from ..composition import build_services

    configure_logging()
    try:
        keys = parse_api_keys(settings.api_keys)
        origins = parse_allowed_origins(settings.allowed_origins)
    except ValidationError as error:
        raise SystemExit(f"amfs-server: {error}") from None
    if not is_loopback(host) and not keys:
        raise SystemExit(
            f"amfs-server: refusing to serve the UI on {host}: binding beyond loopback requires bearer-token auth. "
            "Set AMFS_API_KEYS, or bind to --host 127.0.0.1."
        )
    try:
        services = build_services(settings, ml=True, worker=False)
    except AmfsError as error:  # an embedder that cannot load, a learning store the settings cannot have
        raise SystemExit(f"amfs-server: {error}") from None
    ui = UiServices(services.memory, services.learning, services.ml)
    app = create_ui_app(ui, keys, host=host, allowed_origins=origins)
    shown = f"[{host}]" if ":" in host else host
    print(f"amfs memory browser: http://{shown}:{port}{UI_PATH}/", file=sys.stderr, flush=True)
    from ..h11_guard import guarded_uvicorn_options

    # The same connection limits and header / body deadlines as `serve`.
    uvicorn.run(app, host=host, port=port, log_config=uvicorn_log_config(), **guarded_uvicorn_options(settings.limits))
