"""The embedders by name, and the process-wide factory the server, the SDK, the CLI and the benchmarks use."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..core.embedding import CHAT_MINILM, CHAT_MPNET, DEFAULT_EMBEDDER, GEMMA, MINILM_INT8, MPNET, TORCH_MINILM
from ..core.ports import Embedder

QUERY_ENCODERS = ("auto", "full", "mixed", "fast")
DEFAULT_QUERY_ENCODER = "auto"
"""`AMFS_QUERY_ENCODER`, what embeds a retrieve's question; stored vectors are the embedder's whatever it says, so a
store may switch freely. `auto` (the default since 0.7.16): `mixed` where the embedder has one and the CPU is x86-64
without VNNI (`cpu_has_vnni`), else `full`. `full`: the embedder itself. `mixed`: the same model with its attention
projections on dynamic 8-bit kernels (chat-mpnet's only, MIXED_QUERY_SIDES), about a quarter faster on a CPU
without VNNI, question vectors at cosine 0.995+ to its own; it passed a rule written before its ranking was seen
(README, "On a CPU without VNNI"). `fast`: the embedder's distilled question side (chat-mpnet's only,
FAST_QUERY_SIDES: 7 of its 12 layers), opt-in: on the tuning splits it lost more recall@10 on the agent memories
than the rule written before allowed (README, "A fast question side")."""


def cpu_has_vnni(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool | None:
    """Whether this x86-64 CPU has 8-bit dot-product instructions (AVX-512 VNNI or AVX-VNNI), on which onnxruntime's
    8-bit block MatMuls are fast; None where that cannot be read (not x86-64, or no `cpuinfo`)."""
    import platform

    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    try:
        with cpuinfo.open(encoding="utf-8", errors="replace") as info:
            for line in info:
                if line.startswith("flags"):
                    flags = set(line.partition(":")[2].split())
                    return bool(flags & {"avx512_vnni", "avx_vnni"})
    except OSError:
        return None
    return None


def resolve_query_encoder(embedder: str, query_encoder: str) -> str:
    """`auto` made concrete for `embedder` (canonical name) on this CPU; any other value as it is."""
    if query_encoder != "auto":
        return query_encoder
    return "mixed" if embedder in MIXED_QUERY_SIDES and cpu_has_vnni() is False else "full"


def model_cache_dir() -> Path:
    """Where models unpacked or fetched from packages live: AMFS_MODEL_CACHE, else ~/.cache/amfs-server/models."""
    configured = os.environ.get("AMFS_MODEL_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "amfs-server" / "models"


def _onnx_embedder(variant: str, threads: int | None) -> Any:
    from .onnx_embedder import OnnxEmbedder  # on use: onnxruntime loads only for the embedder asked for

    return OnnxEmbedder(variant=variant, num_threads=threads)


def _torch_embedder(threads: int | None) -> Any:
    from .torch_embedder import MiniLMEmbedder  # on use: torch is the [lm] extra

    return MiniLMEmbedder(num_threads=threads)


def _mpnet_embedder(threads: int | None) -> Any:
    from .torch_embedder import MpnetEmbedder  # on use: torch is the [mpnet] extra

    return MpnetEmbedder(num_threads=threads)


def _gemma_embedder(threads: int | None) -> Any:
    from .gemma_embedder import GemmaEmbedder  # on use: tokenizers is the [gemma] extra

    return GemmaEmbedder(num_threads=threads)


# canonical name -> constructor taking the intra-op thread count (None: the embedder's own default: `default_threads()`
# for the onnxruntime ones, torch's process-wide setting left alone for the torch ones); aliases map onto canonical names.
KNOWN_EMBEDDERS: dict[str, Any] = {
    TORCH_MINILM: _torch_embedder,
    CHAT_MINILM: lambda threads: _onnx_embedder("chat-int8", threads),
    CHAT_MPNET: lambda threads: _onnx_embedder("chat-mpnet-int8", threads),
    MINILM_INT8: lambda threads: _onnx_embedder("int8", threads),
    "all-MiniLM-L6-v2-onnx": lambda threads: _onnx_embedder("fp32", threads),
    MPNET: _mpnet_embedder,
    GEMMA: _gemma_embedder,
}
_ALIASES = {
    "all-minilm-l6-v2": TORCH_MINILM,
    "sentence-transformers/all-minilm-l6-v2": TORCH_MINILM,
    "minilm": TORCH_MINILM,
    "chat-minilm-l6-onnx-int8": CHAT_MINILM,
    "chat-minilm": CHAT_MINILM,
    "chat-mpnet-onnx-int8": CHAT_MPNET,
    "chat-mpnet": CHAT_MPNET,
    "all-minilm-l6-v2-onnx-int8": MINILM_INT8,
    "minilm-onnx-int8": MINILM_INT8,
    "all-minilm-l6-v2-onnx": "all-MiniLM-L6-v2-onnx",
    "minilm-onnx": "all-MiniLM-L6-v2-onnx",
    "all-mpnet-base-v2": MPNET,
    "sentence-transformers/all-mpnet-base-v2": MPNET,
    "mpnet": MPNET,
    "embeddinggemma-300m-onnx-int8": GEMMA,
    "embeddinggemma-300m": GEMMA,
    "embeddinggemma": GEMMA,
    "google/embeddinggemma-300m": GEMMA,
}

# embedder -> the ONNX variant of its distilled question side
FAST_QUERY_SIDES = {CHAT_MPNET: "chat-mpnet-query-int8"}
# embedder -> the ONNX variant of itself with every MatMul on faster kernels
MIXED_QUERY_SIDES = {CHAT_MPNET: "chat-mpnet-mixed-int8"}
QUESTION_SIDES = {"fast": FAST_QUERY_SIDES, "mixed": MIXED_QUERY_SIDES}


def check_query_encoder(embedder: str, query_encoder: str) -> None:
    """Refuse a query encoder that is not one of QUERY_ENCODERS, or `fast` / `mixed` for an embedder (canonical
    name) without such a question side, naming the fix."""
    if query_encoder not in QUERY_ENCODERS:
        raise ValueError(f"Unknown query encoder {query_encoder!r}; use one of {', '.join(QUERY_ENCODERS)}")
    sides = QUESTION_SIDES.get(query_encoder)
    if sides is not None and embedder not in sides:
        raise ValueError(f"the embedder {embedder} has no {query_encoder} question side (only {', '.join(sides)} "
                         "has); set AMFS_QUERY_ENCODER=auto or full")


def question_side(embedder: Any) -> str:
    """The name of what embeds `embedder`'s questions: its question side's, else its own."""
    queries = getattr(embedder, "queries", None)
    return str(queries.name if queries is not None else embedder.name)


class TwoSidedEmbedder:
    """One embedder for what is stored (its name is the store's record) and another, in the same vector space,
    for questions (`embed_query`, which `core.embedding.embed_queries` calls)."""

    def __init__(self, documents: Any, queries: Any) -> None:
        if documents.dimension != queries.dimension:
            raise ValueError(f"{queries.name} makes {queries.dimension}-d vectors, {documents.name} {documents.dimension}-d")
        self.documents, self.queries = documents, queries
        self.name, self.dimension = documents.name, documents.dimension

    @property
    def loaded(self) -> bool:
        return bool(self.documents.loaded and self.queries.loaded)

    def check_available(self) -> None:
        self.documents.check_available()
        self.queries.check_available()

    def load(self) -> "TwoSidedEmbedder":
        self.queries.load()
        self.documents.load()
        return self

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        vectors: np.ndarray = self.documents.embed(texts)
        return vectors

    def embed_query(self, texts: Sequence[str]) -> np.ndarray:
        vectors: np.ndarray = self.queries.embed(texts)
        return vectors

    def __repr__(self) -> str:
        return f"TwoSidedEmbedder(documents={self.documents!r}, queries={self.queries!r})"


_cache: dict[tuple[str, int | None, str], Embedder] = {}
_cache_lock = threading.Lock()


EMBEDDER_CHOICES = ("use chat-mpnet (the default), chat-minilm, embeddinggemma, all-mpnet-base-v2, all-MiniLM-L6-v2 "
                    "or none (README, Embedders; each also by its full name: " + ", ".join(sorted(KNOWN_EMBEDDERS)) + ")")
"""What an unknown embedder name is told: the names the README uses, which `_ALIASES` accepts."""


def canonical_embedder(name: str) -> str | None:
    """The embedder `name` (or one of its aliases, any case) stands for; None for a name this server does not know."""
    return _ALIASES.get(name.strip().lower())


def load_embedder(name: str = DEFAULT_EMBEDDER, threads: int | None = None,
                  query_encoder: str = DEFAULT_QUERY_ENCODER) -> Embedder:
    """Return the process-wide embedder for ``name`` computing on ``threads`` intra-op threads (None: the
    embedder's default, see KNOWN_EMBEDDERS; AMFS_EMBED_THREADS sets it for the server), one instance per name,
    thread count and ``query_encoder`` (QUERY_ENCODERS; AMFS_QUERY_ENCODER).

    Checks cheaply that the model and runtime are installed (raising
    :class:`EmbedderUnavailableError` otherwise) but loads weights lazily on
    first use; call ``.load()`` on the result to warm it up eagerly.
    """
    canonical = canonical_embedder(name) if isinstance(name, str) else None
    if canonical is None:
        raise ValueError(
            f"Unknown embedder {name!r}; {EMBEDDER_CHOICES}"
        )
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(f"The embedder's thread count must be a whole number >= 1, got {threads!r}")
    check_query_encoder(canonical, query_encoder)
    query_encoder = resolve_query_encoder(canonical, query_encoder)
    key = (canonical, threads, query_encoder)
    with _cache_lock:
        emb = _cache.get(key)
        if emb is None:
            candidate = KNOWN_EMBEDDERS[canonical](threads)
            if query_encoder in QUESTION_SIDES:
                candidate = TwoSidedEmbedder(candidate, _onnx_embedder(QUESTION_SIDES[query_encoder][canonical], threads))
            candidate.check_available()  # raises; failures are not cached
            emb = _cache[key] = candidate
    return emb
