"""The memory browser: a read-mostly web page over the running server's services, at `/ui`.

`ui_routes(...)` builds the Starlette routes (page, static assets, JSON API); `register_ui` adds them to
a FastMCP app (HTTP and SSE transports: same process, same store, same keys); `create_ui_app` wraps them
in a standalone Starlette app for `amfs-server ui` (the local store, on loopback).
"""

from .api import UI_PATH, UiServices, create_ui_app, register_ui, run_ui, ui_routes

__all__ = ["UI_PATH", "UiServices", "create_ui_app", "register_ui", "run_ui", "ui_routes"]
