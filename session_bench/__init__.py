"""Benchmarks only: a leaf that uses the whole server and that nothing in the server imports.

Its plotting needs the `[bench]` extra (matplotlib)."""

from __future__ import annotations

from typing import Any


def pyplot() -> Any:
    """matplotlib's pyplot on the file-only Agg backend, or SystemExit with the install hint."""
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("amfs-server bench: plots need matplotlib. Install it with: pip install 'amfs-server[bench]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
