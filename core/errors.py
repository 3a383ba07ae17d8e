"""Domain errors. Each message names the problem and the next step; front ends translate them, never swallow them."""

from __future__ import annotations


class AmfsError(Exception):
    """Base class of every error the memory engine raises on purpose."""


class ValidationError(AmfsError, ValueError):
    """Input that the engine refuses; nothing was written."""


class NotFoundError(AmfsError, LookupError):
    """A memory, version or record that does not exist (or has expired)."""


class ConflictError(AmfsError):
    """A write that lost a race it could not retry its way out of."""


class StoreError(AmfsError):
    """The store cannot be opened or used (corrupt file, unreachable database, missing extension)."""


class StorageFullError(StoreError):
    """The disk (or database) holding the store has no space left: writes fail until space is freed."""


class InsufficientDataError(AmfsError):
    """An ML operation that needs more outcome data than the store holds."""


class MissingExtraError(AmfsError):
    """A feature whose optional dependencies (a pip extra) are not installed; the message gives the install command."""


CPU_TORCH = "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
"""CPU-only torch, to install before an extra that needs torch (else pip pulls the CUDA build, gigabytes)."""


def install_extra(extra: str, torch: bool = False) -> str:
    """The command that installs one of amfs-server's optional extras (with `torch`, CPU torch first). It installs
    from its source checkout (`pip install .`, README), not from PyPI, where a package named `amfs-server` could be
    anyone's."""
    command = f"pip install '.[{extra}]' (in the amfs-server checkout)"
    return f"{CPU_TORCH} && {command}" if torch else command
