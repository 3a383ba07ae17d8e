"""The amfs_* MCP tools. Each is one MemoryService call with a description for the model, MCP
annotations, constrained parameters and a structured result; a tool is registered only when the
service method it calls exists."""

from __future__ import annotations

from fastmcp import FastMCP

from ..core.service import MemoryService
from . import memory, outcomes, search
from ._registry import ActorResolver, ToolErrorMiddleware, ToolRegistry


def register_tools(mcp: FastMCP, service: MemoryService, actors: ActorResolver) -> None:
    registry = ToolRegistry[MemoryService](mcp, service, actors)
    for module in (memory, search, outcomes):
        module.register(registry)


__all__ = ["ActorResolver", "ToolErrorMiddleware", "register_tools"]
