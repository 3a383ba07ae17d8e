"""Benchmarks only: a leaf that uses the whole server and that nothing in the server imports.

Its plotting needs the `[bench]` extra (matplotlib)."""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ..core.errors import install_extra

SINGLE_STRATEGIES = ("semantic", "keyword", "temporal", "confidence")


def alone(name: str) -> dict[str, float]:
    """Weights that rank by one strategy only: every other strategy (speaker and learned included) at 0."""
    from ..core.retrieval import STRATEGIES

    return {strategy: (1.0 if strategy == name else 0.0) for strategy in STRATEGIES}


def bench_embedder(spec: str | None, query_encoder: str = "auto"):
    """The embedder a benchmark runs with: a known embedder by name (None: the server's default) with
    `query_encoder` as the server's AMFS_QUERY_ENCODER, an ONNX file of MiniLM's or mpnet's architecture
    (``.onnx`` or ``.onnx.gz``, as `scripts/export_embedder_onnx.py` writes it), or a folder
    `scripts/finetune_embedder.py` wrote (a MiniLM or an mpnet, run on torch), so a candidate model is measured by
    the same code as the shipped one (a file or folder embeds the questions too). Raises ValueError or
    EmbedderUnavailableError with what is wrong."""
    if not spec or not (Path(spec).is_dir() or spec.endswith((".onnx", ".onnx.gz"))):
        from ..adapters.embedders import load_embedder
        from ..core.embedding import DEFAULT_EMBEDDER

        return load_embedder(spec or DEFAULT_EMBEDDER, query_encoder=query_encoder)
    if query_encoder in ("fast", "mixed"):
        raise ValueError(f"--query-encoder {query_encoder} takes an embedder by name, not a model file or folder")
    if Path(spec).is_dir():
        return _model_folder_embedder(Path(spec))
    from ..adapters.onnx_embedder import OnnxEmbedder

    embedder = OnnxEmbedder.for_file(spec)
    embedder.check_available()
    return embedder


def _model_folder_embedder(folder: Path):
    """A fine-tuned transformers folder on the torch embedder of its architecture, named after the folder (its
    vectors are its own, so a store it writes must not be recorded as the base model's)."""
    import json

    from ..adapters.torch_embedder import MiniLMEmbedder, MpnetEmbedder

    config = folder / "config.json"
    if not config.is_file():
        raise ValueError(f"{folder}: not a model folder (no config.json); pass a folder scripts/finetune_embedder.py wrote")
    kinds = {"bert": MiniLMEmbedder, "mpnet": MpnetEmbedder}
    try:
        kind = json.loads(config.read_text()).get("model_type")
    except (ValueError, AttributeError):
        raise ValueError(f"{config}: not a model's config (not a JSON object)") from None
    if kind not in kinds:
        raise ValueError(f"{folder}: a {kind!r} model; the benchmarks run folders of {' or '.join(kinds)} models")
    embedder = kinds[kind](model_dir=folder, num_threads=1)
    embedder.name = f"model-folder:{folder.name}"
    embedder.check_available()
    return embedder


def add_query_encoder_option(parser: Any) -> None:
    from ..adapters.embedders import DEFAULT_QUERY_ENCODER, QUERY_ENCODERS

    parser.add_argument("--query-encoder", choices=QUERY_ENCODERS, default=DEFAULT_QUERY_ENCODER,
                        help="what embeds the questions (the server's AMFS_QUERY_ENCODER): mixed on a CPU without "
                             "VNNI, else full (auto, the server's default), the embedder itself (full), itself on "
                             "faster kernels (mixed) or chat-mpnet's cheaper question side (fast)")


def embedder_option(parser: Any, spec: str | None, query_encoder: str = "auto"):
    """`bench_embedder(spec, query_encoder)` for a command line's `--embedder` / `--query-encoder`: what is wrong
    is `parser`'s usage error (exit 2 with the message)."""
    from ..core.embedding import EmbedderUnavailableError

    try:
        return bench_embedder(spec, query_encoder)
    except (ValueError, EmbedderUnavailableError) as error:
        parser.error(str(error))


def pyplot() -> Any:
    """matplotlib's pyplot on the file-only Agg backend, or SystemExit with the install hint."""
    try:
        import matplotlib
    except ImportError:
        raise SystemExit(f"amfs-server bench: plots need matplotlib. Install it with: {install_extra('bench')}") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


async def open_store(kind: str, workdir: Path, dimension: int):
    if kind == "sqlite":
        from ..adapters.sqlite import SQLiteStore

        store = SQLiteStore(workdir / f"bench-{uuid.uuid4().hex[:8]}.db")
    else:
        from ..adapters.postgres import PostgresStore

        store = PostgresStore(postgres_dsn(), embedding_dimension=dimension, schema=f"amfs_bench_{uuid.uuid4().hex[:8]}")
    await store.open()
    return store


async def close_store(store) -> None:
    if hasattr(store, "drop_schema"):
        await store.drop_schema()
    await store.close()


DEFAULT_POSTGRES_DSN = "postgresql://postgres@127.0.0.1:5432/test"  # what scripts/ensure_postgres.sh provides


def postgres_dsn() -> str:
    return os.environ.get("AMFS_POSTGRES_DSN") or DEFAULT_POSTGRES_DSN


def schema_dsn(dsn: str, schema: str) -> str:
    """`dsn` with its search path set to `schema` (a server keeps its tables in the DSN's first schema)."""
    parts = urlsplit(dsn)
    query = [(name, value) for name, value in parse_qsl(parts.query) if name not in ("search_path", "options")]
    return urlunsplit(parts._replace(query=urlencode(query + [("search_path", schema)])))


async def drop_schema(dsn: str, schema: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()


@contextmanager
def fresh_postgres_schema(prefix: str) -> Iterator[str]:
    """The benchmarks' DSN with its search path set to a new schema named `prefix_<8 hex>`, dropped on leaving, also
    after an error (for code outside an event loop). A drop that fails says what is left and lets the first error
    through."""
    schema = f"{prefix}_{uuid.uuid4().hex[:8]}"
    try:
        yield schema_dsn(postgres_dsn(), schema)
    finally:
        try:
            asyncio.run(drop_schema(postgres_dsn(), schema))
        except Exception as error:
            print(f"schema {schema} left behind ({type(error).__name__}); drop it with: DROP SCHEMA \"{schema}\" CASCADE",
                  file=sys.stderr)


async def postgres_problem(dsn: str) -> str | None:
    """Why a benchmark cannot use the PostgreSQL at `dsn` (None when it can), said before any work starts; the DSN
    is named without its password."""
    import asyncpg

    from ..adapters.postgres_base import redact_dsn

    try:
        conn = await asyncpg.connect(dsn, timeout=10)
    except (OSError, asyncpg.PostgresError) as error:  # refused, unknown host, auth: "not here"
        return (f"cannot connect to PostgreSQL at {redact_dsn(dsn)} ({type(error).__name__}: {error}); start it "
                "(bash scripts/ensure_postgres.sh) or set AMFS_POSTGRES_DSN")
    except Exception as error:  # the DSN did not parse; the driver's text may quote part of the password
        return (f"cannot use the DSN {redact_dsn(dsn)} ({type(error).__name__}); check AMFS_POSTGRES_DSN, "
                "percent-encoding '/', '?', '#' and '@' in its password")
    try:
        if await conn.fetchval("SELECT count(*) FROM pg_available_extensions WHERE name = 'vector'") == 0:
            return f"PostgreSQL at {redact_dsn(dsn)} has no pgvector extension; install it (bash scripts/ensure_postgres.sh)"
    finally:
        await conn.close()
    return None
