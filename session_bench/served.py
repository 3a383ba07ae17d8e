"""A server app built for a benchmark, called over an in-memory MCP client: what `--via-server` runs through."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any


class ToolRefused(Exception):
    """A tool error that ``call`` was told is one item of the run (its ``refusal`` pattern matched), not its end."""


class ServedApp:
    """An app from ``create_app`` with the LM backbone configured and its own store under ``data_dir``.

    No environment is read: the benchmark's settings are its arguments, and nothing persisted elsewhere
    (a learned ranker under ./.amfs/ml) joins retrieval. A failed tool call stops the benchmark with the
    tool's message, prefixed by ``who``.
    """

    def __init__(self, data_dir: Path, backbone_spec: str, who: str, embedder_spec: str | None = None) -> None:
        from ..server.app import create_app
        from ..server.composition import build_service
        from ..server.settings import load_settings

        overrides: dict[str, Any] = {"lm_backbone": backbone_spec}
        if embedder_spec is not None:
            overrides["embedder"] = embedder_spec
        settings = load_settings({}, data_dir=data_dir, ml_model_dir=data_dir / "ml", **overrides)
        self.app = create_app(build_service(settings), settings)
        self.who = who
        self.client: Any = None

    async def __aenter__(self) -> ServedApp:
        from fastmcp import Client

        self.client = Client(self.app)
        await self.client.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.client.__aexit__(*exc)

    async def tool_names(self) -> set[str]:
        return {t.name for t in await self.client.list_tools()}

    async def call(self, tool: str, arguments: dict[str, Any], *, refusal: re.Pattern[str] | None = None,
                   about: str = "") -> dict[str, Any]:
        """The tool's structured result. An error whose message ``refusal`` matches raises ``ToolRefused``; any other
        error ends the benchmark, its message naming ``about`` (what was being done) when given."""
        result = await self.client.call_tool(tool, arguments, raise_on_error=False)
        if result.is_error:
            text = result.content[0].text if result.content else "(no message)"
            if refusal is not None and refusal.search(text):
                raise ToolRefused(f"{tool}: {text}")
            raise SystemExit(f"{self.who}: {tool} failed{f' ({about})' if about else ''}: {text}")
        structured: dict[str, Any] = result.structured_content
        return structured
