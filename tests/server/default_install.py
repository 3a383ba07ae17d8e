"""Run `amfs-server` as if only the default install (`pip install amfs-server`, no extras) were there.

The test environment also holds the extras (torch, LightGBM, the fastmcp client and what it pulls in), so a
server path that imports a package outside the default install would pass here and fail for a user: the
default install takes FastMCP as fastmcp-slim with a hand-picked part of its `server` extra, and a lazy import
in FastMCP can reach for the rest. The suite's real servers (tests/server/conftest.py) start through this file,
which makes every module of an installed distribution outside the default install's dependency closure
unimportable before the CLI is imported.

    python tests/server/default_install.py serve --transport http ...
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.metadata as metadata
import sys
from collections.abc import Sequence
from types import ModuleType

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def default_install_closure(root: str = "amfs-server") -> set[str]:
    """The distributions `pip install <root>` needs: its requirements without extras, and theirs, with the
    extras each requirement names (fastmcp-slim[mcp] brings what fastmcp-slim's `mcp` extra lists)."""
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [(canonicalize_name(root), frozenset[str]())]
    while todo:
        name, extras = todo.pop()
        if (name, extras) in seen:
            continue
        seen.add((name, extras))
        try:
            requires = metadata.distribution(name).requires or []
        except metadata.PackageNotFoundError:
            continue  # a dependency for another platform or Python, not installed here
        for line in requires:
            requirement = Requirement(line)
            marker = requirement.marker
            if marker is None or any(marker.evaluate({"extra": extra}) for extra in extras | {""}):
                todo.append((canonicalize_name(requirement.name), frozenset(requirement.extras)))
    return {name for name, _ in seen}


def modules_outside(closure: set[str]) -> set[str]:
    """Top-level modules every installed distribution providing them is outside `closure` (stdlib: none)."""
    return {
        module for module, dists in metadata.packages_distributions().items()
        if not any(canonicalize_name(dist) in closure for dist in dists)
    }


class _OutsideTheDefaultInstall(importlib.abc.MetaPathFinder):
    def __init__(self, blocked: set[str]) -> None:
        self.blocked = blocked

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.partition(".")[0] in self.blocked:
            raise ModuleNotFoundError(
                f"No module named {fullname!r} (outside the default install: tests/server/default_install.py)",
                name=fullname,
            )
        return None


def block_outside_default_install() -> set[str]:
    """Install the import guard; returns the blocked top-level module names."""
    blocked = modules_outside(default_install_closure())
    sys.meta_path.insert(0, _OutsideTheDefaultInstall(blocked))
    return blocked


if __name__ == "__main__":
    block_outside_default_install()
    from amfs_server.server.cli import main

    main()
