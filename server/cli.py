"""The `amfs-server` command: with no arguments it serves MCP over stdio; `serve` picks a transport;
`memory ...` inspects and manages the store. Every command is documented in the README (checked by a test)."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from ..core.errors import AmfsError
from ..core.service import MemoryService
from .composition import build_service
from .export_format import ExportFormatError, dump_export, parse_export
from .settings import load_settings

T = TypeVar("T")


def _run_with_service(fn: Callable[[MemoryService], Awaitable[T]], embedder: bool = False) -> T:
    """Open the configured store (no embedder unless asked: inspection needs no model), run, close."""
    settings = load_settings(**({} if embedder else {"embedder": "none"}))

    async def main() -> T:
        service = build_service(settings)
        await service.open()
        try:
            return await fn(service)
        finally:
            await service.close()

    try:
        return asyncio.run(main())
    except AmfsError as error:
        raise click.ClickException(str(error)) from None


@click.group(invoke_without_command=True)
@click.pass_context
def cli(ctx: click.Context) -> None:
    """amfs-server: an MCP memory server for coding agents. With no command, serves MCP over stdio."""
    if ctx.invoked_subcommand is None:
        ctx.invoke(serve)


@cli.command()
@click.option("--transport", type=click.Choice(["stdio", "sse", "http"]), default="stdio", show_default=True)
@click.option("--host", default="127.0.0.1", show_default=True, help="Bind address for sse/http.")
@click.option("--port", default=8000, show_default=True, type=int, help="Port for sse/http.")
def serve(transport: str, host: str, port: int) -> None:
    """Serve the amfs_* MCP tools over stdio, SSE (/sse) or streamable HTTP (/mcp)."""
    from .app import run_server

    run_server(load_settings(), transport=transport, host=host, port=port)


@cli.group()
def memory() -> None:
    """Inspect and manage what the store holds."""


@memory.command("show")
@click.option("--entity-path", default=None, help="Only entries under this entity path.")
@click.option("--limit", default=50, show_default=True, type=int)
def memory_show(entity_path: str | None, limit: int) -> None:
    """List current entries with their confidence, version and tier."""

    async def show(service: MemoryService) -> list[str]:
        entries = await service.list(entity_path)
        lines = [f"Memories ({len(entries)}):"]
        for entry in entries[:limit]:
            value = json.dumps(entry.value, ensure_ascii=False)
            value = value if len(value) <= 80 else value[:77] + "..."
            lines.append(
                f"- {entry.entry_key} v{entry.version} confidence={entry.confidence:.4f} "
                f"type={entry.memory_type.value} tier={int(entry.tier)}: {value}"
            )
        if len(entries) > limit:
            lines.append(f"... {len(entries) - limit} more (use --limit)")
        return lines

    for line in _run_with_service(show):
        click.echo(line)


@memory.command("export")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write to this file instead of stdout.")
def memory_export(output: Path | None) -> None:
    """Export every version, outcome record and trace as JSON."""

    async def export(service: MemoryService) -> str:
        return dump_export(await service.export_snapshot())

    text = _run_with_service(export)
    if output is None:
        sys.stdout.write(text + "\n")
    else:
        output.write_text(text + "\n", encoding="utf-8")
        click.echo(f"Exported to {output}", err=True)


@memory.command("import")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
def memory_import(path: Path) -> None:
    """Import an export file exactly; a malformed file is refused with the reason and nothing is imported."""
    try:
        snapshot = parse_export(path.read_text(encoding="utf-8"))
    except ExportFormatError as error:
        raise click.ClickException(f"{path}: {error}. Nothing was imported.") from None

    async def load(service: MemoryService) -> None:
        await service.import_snapshot(snapshot)

    _run_with_service(load)
    click.echo(
        f"Imported {len(snapshot.entries)} entry versions, {len(snapshot.outcomes)} outcomes, "
        f"{len(snapshot.traces)} trace events."
    )


@memory.command("forget")
@click.argument("entry_key")
def memory_forget(entry_key: str) -> None:
    """Delete every version of ENTITY/KEY (e.g. checkout-service/retry-pattern)."""
    from ..core.models import split_entry_key

    async def forget(service: MemoryService) -> int:
        entity_path, key = split_entry_key(entry_key)
        return await service.forget(entity_path, key)

    removed = _run_with_service(forget)
    click.echo(f"Forgot {entry_key} ({removed} versions).")


@memory.command("clear")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def memory_clear(yes: bool) -> None:
    """Delete everything in the store (asks for confirmation unless --yes)."""
    if not yes:
        click.confirm("Delete every memory, outcome and trace in the store?", abort=True)

    async def clear(service: MemoryService) -> None:
        await service.clear()

    _run_with_service(clear)
    click.echo("Cleared the store.")


def main(argv: list[str] | None = None) -> Any:
    return cli.main(args=argv, prog_name="amfs-server")
