"""The README's MCP section documents every tool the server registers, with its MCP annotations."""

from __future__ import annotations

import re
from pathlib import Path

from fastmcp import Client

README = Path(__file__).resolve().parents[2] / "README.md"
KIND_BY_ANNOTATIONS = {(True, None): "read-only", (False, False): "write", (False, True): "destructive"}


def readme_sections() -> tuple[str, str]:
    """(the whole README, its MCP section)."""
    text = README.read_text(encoding="utf-8")
    start, end = text.index("<!-- mcp:start -->"), text.index("<!-- mcp:end -->")
    return text, text[start:end]


def tool_rows(text: str) -> dict[str, str]:
    """Rows of tool tables: `| `amfs_x` | first cell | ... |` -> {name: first cell}."""
    rows = re.findall(r"^\|\s*`(amfs_\w+)`\s*\|\s*([^|]+?)\s*\|", text, flags=re.MULTILINE)
    return {name: cell for name, cell in rows}


async def test_readme_tool_tables_document_every_registered_tool_and_nothing_else(client: Client) -> None:
    """The MCP section's table covers the memory tools; other sections (learning, ml) document their own."""
    whole, mcp = readme_sections()
    registered = {tool.name: tool for tool in await client.list_tools()}
    documented_here = tool_rows(mcp)
    assert set(registered) <= set(tool_rows(whole)), "registered tools missing from the README"
    assert set(documented_here) <= set(registered), "README rows for tools the server does not register"
    for name, kind in documented_here.items():
        hints = registered[name].annotations
        assert kind.split()[0] == KIND_BY_ANNOTATIONS[(hints.read_only_hint, hints.destructive_hint)], name


def test_readme_documents_client_configs_inspector_and_api_keys() -> None:
    _, section = readme_sections()
    for needle in [
        "claude_desktop_config.json", ".cursor/mcp.json", "claude mcp add", "--transport http",
        "@modelcontextprotocol/inspector@0.15.0 --cli", "AMFS_API_KEYS", "AMFS_ALLOWED_ORIGINS",
        "python -m amfs_server.session_bench.mcp_latency",
    ]:
        assert needle in section, needle
