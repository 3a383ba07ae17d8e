"""Every CLI command appears in the README (house rule 10)."""

from __future__ import annotations

from pathlib import Path

import click

from amfs_server.server.cli import cli

README = Path(__file__).resolve().parents[2] / "README.md"


def command_paths(group: click.Group, prefix: str = "amfs-server") -> list[str]:
    paths = []
    for name, command in group.commands.items():
        path = f"{prefix} {name}"
        paths.append(path)
        if isinstance(command, click.Group):
            paths.extend(command_paths(command, path))
    return paths


def test_every_cli_command_is_documented_in_the_readme() -> None:
    text = README.read_text(encoding="utf-8")
    missing = [path for path in command_paths(cli) if f"`{path}" not in text]
    assert not missing, f"README lacks these commands: {missing}"
