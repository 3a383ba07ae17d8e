"""The embedders by name, and the process-wide factory the server, the SDK, the CLI and the benchmarks use."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from ..core.embedding import CHAT_MINILM, CHAT_MPNET, DEFAULT_EMBEDDER, GEMMA, MINILM_INT8, MPNET, TORCH_MINILM
from ..core.ports import Embedder


def model_cache_dir() -> Path:
    """Where models unpacked or fetched from packages live: AMFS_MODEL_CACHE, else ~/.cache/amfs-server/models."""
    configured = os.environ.get("AMFS_MODEL_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "amfs-server" / "models"


def _onnx_embedder(variant: str) -> Any:
    from .onnx_embedder import OnnxEmbedder  # on use: onnxruntime loads only for the embedder asked for

    return OnnxEmbedder(variant=variant)


def _torch_embedder() -> Any:
    from .torch_embedder import MiniLMEmbedder  # on use: torch is the [lm] extra

    return MiniLMEmbedder()


def _mpnet_embedder() -> Any:
    from .torch_embedder import MpnetEmbedder  # on use: torch is the [mpnet] extra

    return MpnetEmbedder()


def _gemma_embedder() -> Any:
    from .gemma_embedder import GemmaEmbedder  # on use: tokenizers is the [gemma] extra

    return GemmaEmbedder()


# canonical name -> constructor; aliases map onto canonical names.
KNOWN_EMBEDDERS: dict[str, Any] = {
    TORCH_MINILM: _torch_embedder,
    CHAT_MINILM: lambda: _onnx_embedder("chat-int8"),
    CHAT_MPNET: lambda: _onnx_embedder("chat-mpnet-int8"),
    MINILM_INT8: lambda: _onnx_embedder("int8"),
    "all-MiniLM-L6-v2-onnx": lambda: _onnx_embedder("fp32"),
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

_cache: dict[str, Embedder] = {}
_cache_lock = threading.Lock()


def canonical_embedder(name: str) -> str | None:
    """The embedder `name` (or one of its aliases, any case) stands for; None for a name this server does not know."""
    return _ALIASES.get(name.strip().lower())


def load_embedder(name: str = DEFAULT_EMBEDDER) -> Embedder:
    """Return the process-wide embedder for ``name`` (one instance per name).

    Checks cheaply that the model and runtime are installed (raising
    :class:`EmbedderUnavailableError` otherwise) but loads weights lazily on
    first use; call ``.load()`` on the result to warm it up eagerly.
    """
    canonical = canonical_embedder(name) if isinstance(name, str) else None
    if canonical is None:
        raise ValueError(
            f"Unknown embedder {name!r}; known embedders: {', '.join(sorted(KNOWN_EMBEDDERS))}"
        )
    with _cache_lock:
        emb = _cache.get(canonical)
        if emb is None:
            candidate = KNOWN_EMBEDDERS[canonical]()
            candidate.check_available()  # raises; failures are not cached
            emb = _cache[canonical] = candidate
    return emb
