"""Compiled memories: the prefix channel's key/value caches, and the decoding loop.

This module owns three things:

* ``PromptLayout``: the one prompt shape every mode uses, cut into the pieces
  the prefix channel needs: a *head* (chat template + instructions up to where
  the notes begin), one *line* per memory, and a *suffix* (what follows the
  notes: the question and the assistant tag).
* ``MemoryCompiler``: runs each memory line through the backbone once, right
  after the compiled head, and keeps its per-layer keys/values (LRU in memory,
  safetensors on disk, both bounded). ``build_prefix`` concatenates the head
  and any memories into one cache, re-rotating each memory's keys by the RoPE
  angle of the distance between where it was compiled and where it now sits.
* ``generate_with_prefix`` / ``generate_text``: one greedy decoding loop
  (one forward per token, no logit shaping) used by every mode, so that timings
  compare like for like. The prefix mode prefills only the suffix.

The pieces are tokenized apart (head, each memory line, the suffix), the text
modes tokenize the whole prompt. Where a tokenizer merges across a boundary
(Qwen2's byte-level BPE: the last memory's "\n" and the suffix's "\n" become
one "\n\n" token, where SmolLM2's keep them apart), every call checks the
joint tokenization and re-prefills from the first differing token
(``joint_tokens``; ``GenerationMetrics.retokenized_tokens`` says how many
compiled tokens that dropped), so the prefix mode always reads the text
prompt's tokens.

Why memories are compiled *after the head* rather than on their own: the first
token of a sequence acts as an attention sink; a memory compiled from position
0 would carry a second sink into the middle of the prompt. Compiled after the
head, a memory's cache is exactly what a text prompt with that one memory would
hold, so one memory reproduces the text answer token for token (SmolLM2: 10/10
queries). With several memories, each one after the first lacks attention to
the memories before it; its keys/values drift from a text prefill's in every
layer but the first, and a weak reader loses accuracy: on SmolLM2 with five
memories per query (the right one first, four same-person or same-attribute
distractors, 120 generated queries) text answers 63%, plain concatenation 32%.

``key_scale`` multiplies the keys of the memories after the first, a softmax
temperature on them: below 1 it tells the reader to trust the first memory
(the retriever's top-1) more, and it is a bet that the top-1 is right (when
the right memory is not first it loses to text). 1.0 is plain concatenation.
It was chosen on the session benchmark's tuning seeds only (generated
sessions 100-102, 30 facts, 24 questions, SmolLM2-135M, top-k 3, strict hit
rule): 0.6 answered 22/24, 0.8 19/24, 1.0 13/24, so 0.6 is the default; the
same run gave the top-1 memory alone as text 23/24, so what the scale buys is
trust in the top-1, which plain text with only that memory has too. The
README reports all three on reporting seeds.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import os
import threading
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch
from safetensors.torch import load_file, save_file
from transformers import DynamicCache

from .backbone import Backbone
from .prompts import SYSTEM_PROMPT, USER_TEMPLATE

# Sentinels cut the rendered chat template into head / notes / suffix. They
# contain no characters a template would escape or strip.
_NOTES_SENTINEL = "\u2063NOTES\u2063"
_QUESTION_SENTINEL = "\u2063QUESTION\u2063"

_HEAD_ID = "__head__"
# Attention temperature for memories after the first, as a key multiplier;
# 1.0 is plain concatenation. Below 1 it trusts the retriever's top-1 more
# (see the module docstring for what it buys and costs).
DEFAULT_KEY_SCALE = 0.6  # chosen on tuning seeds (see the module docstring)
_FORMAT = 3  # bump when the compiled layout on disk changes (2: the compiled line is kept; 3: special tokens defused)


# ---------------------------------------------------------------------------
# Prompt layout
# ---------------------------------------------------------------------------

@functools.lru_cache(maxsize=8)
def _alternation(strings: tuple[str, ...]) -> re.Pattern[str]:
    """One regex matching any of `strings`, tried in the order given (longest first for `PromptLayout.specials`)."""
    return re.compile("|".join(re.escape(string) for string in strings))


def _broken(token: str) -> str:
    """`token` with a space after its first visible character (`< |im_start|>`, ` < x>` for ` <x>`)."""
    at = len(token) - len(token.lstrip()) + 1
    return token[:at] + " " + token[at:]


@dataclass(frozen=True)
class PromptLayout:
    """The prompt cut into head + memory lines + suffix around the question.

    ``head + "".join(memory_line(m) for m in memories) + mid + question + tail``
    is exactly what the tokenizer's chat template renders for ``messages(...)``.
    """

    head: str
    mid: str
    tail: str
    system_prompt: str
    user_template: str
    # The tokenizer's special-token strings (`<|im_start|>`, ...), longest first: a memory or question holding one
    # would be read as that control token and could forge a system or assistant turn (red-team finding, 0.7.12).
    specials: tuple[str, ...] = ()

    @classmethod
    def for_tokenizer(cls, tokenizer: Any, system_prompt: str = SYSTEM_PROMPT,
                      user_template: str = USER_TEMPLATE) -> "PromptLayout":
        """Render the chat template once with sentinels and cut it at them.

        ``user_template`` must contain ``{notes}`` before ``{question}``.
        """
        if user_template.find("{notes}") < 0 or user_template.find("{notes}") > user_template.find("{question}"):
            raise ValueError("user_template must contain {notes} before {question}")
        messages = [
            {"role": "system", "content": system_prompt},
            {"role": "user", "content": user_template.format(notes=_NOTES_SENTINEL, question=_QUESTION_SENTINEL)},
        ]
        rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        head, rest = rendered.split(_NOTES_SENTINEL)
        mid, tail = rest.split(_QUESTION_SENTINEL)
        # Every added token, special or not: the tokenizer splits each out as one token wherever it occurs.
        specials = set(getattr(tokenizer, "all_special_tokens", ()))
        specials.update(token.content for token in getattr(tokenizer, "added_tokens_decoder", {}).values())
        return cls(head=head, mid=mid, tail=tail, system_prompt=system_prompt, user_template=user_template,
                   specials=tuple(sorted((t for t in specials if len(t.strip()) > 1), key=len, reverse=True)))

    def defused(self, text: str) -> str:
        """`text` (a memory, a question: anyone's words) with every special-token string broken by a space after
        its first visible character (`< |im_start|>`), so the tokenizer reads it as plain text. One pass over the text
        (the longest token first where several start at one place): what a break inserts is never looked at again."""
        if not any(special in text for special in self.specials):
            return text
        return _alternation(self.specials).sub(lambda found: _broken(found.group(0)), text)

    def memory_line(self, text: str) -> str:
        # One memory per line; newlines inside a memory would merge lines.
        return "- " + " ".join(self.defused(text).split()) + "\n"

    def suffix(self, question: str, text_memories: Sequence[str] = ()) -> str:
        """What is prefilled at query time: optional memories as text, then the question part."""
        return ("".join(self.memory_line(t) for t in text_memories) + self.mid + self.defused(question.strip())
                + self.tail)

    def render(self, memories: Sequence[str], question: str) -> str:
        return self.head + "".join(self.memory_line(m) for m in memories) + self.suffix(question)

    def messages(self, memories: Sequence[str], question: str) -> list[dict[str, str]]:
        """Chat messages for text modes; renders to ``render(memories, question)``."""
        notes = "".join(self.memory_line(m) for m in memories)
        return [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": self.user_template.format(notes=notes, question=self.defused(question.strip()))},
        ]

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(json.dumps([self.head, self.mid, self.tail]).encode()).hexdigest()[:16]


def encode(backbone: Backbone, text: str) -> list[int]:
    # The chat template already holds every special token; adding BOS/EOS here
    # would make segment-wise and whole-prompt tokenization disagree.
    return backbone.tokenizer(text, add_special_tokens=False)["input_ids"]


def segmentation_agrees(backbone: Backbone, layout: PromptLayout, memories: Sequence[str], question: str) -> bool:
    """True when tokenizing head, lines and suffix separately equals tokenizing the whole prompt.

    The prefix channel tokenizes segments separately; if a tokenizer merged
    across a segment boundary, prefix and text modes would see different tokens.
    """
    pieces = [layout.head, *(layout.memory_line(m) for m in memories), layout.suffix(question)]
    joined = [t for piece in pieces for t in encode(backbone, piece)]
    return joined == encode(backbone, layout.render(memories, question))


# ---------------------------------------------------------------------------
# Rotary re-rotation
# ---------------------------------------------------------------------------

def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rerotate_keys(keys: torch.Tensor, delta: int | torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Move RoPE-rotated keys ``delta`` positions along (negative moves back).

    RoPE rotates each (i, i + d/2) pair by ``position * inv_freq[i]``; rotations
    compose, so a key rotated for position p becomes the key for p + delta by
    one more rotation of ``delta * inv_freq``. ``keys``: [..., seq, head_dim];
    ``delta``: one shift for all, or a [seq] tensor with one per token. A zero
    shift leaves a key bit-for-bit unchanged (cos 0 = 1, sin 0 = 0). Computed
    in float32 and cast back.
    """
    if isinstance(delta, int):
        if delta == 0:
            return keys
        delta = torch.full((keys.shape[-2],), delta)
    freqs = delta.to(device=keys.device, dtype=torch.float32)[:, None] * inv_freq.to(keys.device, torch.float32)
    emb = torch.cat((freqs, freqs), dim=-1)
    k = keys.to(torch.float32)
    return (k * emb.cos() + _rotate_half(k) * emb.sin()).to(keys.dtype)


# ---------------------------------------------------------------------------
# Compiled memories
# ---------------------------------------------------------------------------

@dataclass
class CompiledMemory:
    """One segment's keys/values as the backbone computed them at ``base_position``.

    ``keys``/``values``: one tensor per layer, [kv_heads, n_tokens, head_dim].
    """

    memory_id: str
    cache_key: str
    token_ids: list[int]
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    base_position: int
    compile_ms: float = 0.0
    origin: str = "compiled"  # compiled | memory | disk: where this object came from
    line: str = ""  # the prompt text compiled (head or memory line): to check the joint tokenization against

    @property
    def n_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))


@dataclass
class Prefix:
    """Concatenated, re-rotated caches: head first, then memories in the given order."""

    keys: list[torch.Tensor]  # per layer [1, kv_heads, n_tokens, head_dim]
    values: list[torch.Tensor]
    token_ids: list[int]
    layout: PromptLayout
    segments: list[tuple[str, int, int]]  # (memory_id, start, end) positions
    build_ms: float
    text: str = ""  # the prompt text the cache stands for: head + memory lines

    @property
    def n_tokens(self) -> int:
        return len(self.token_ids)

    def to_cache(self, n_tokens: int | None = None) -> DynamicCache:
        """A fresh cache for one generation (its first ``n_tokens``, default all); decoding appends to it,
        the prefix stays intact."""
        if n_tokens is None or n_tokens == self.n_tokens:
            return DynamicCache(ddp_cache_data=list(zip(self.keys, self.values)))
        return DynamicCache(ddp_cache_data=[(k[:, :, :n_tokens], v[:, :, :n_tokens])
                                            for k, v in zip(self.keys, self.values)])


@dataclass
class CompilerStats:
    compiled: int = 0
    memory_hits: int = 0
    disk_hits: int = 0
    memory_evictions: int = 0
    disk_evictions: int = 0
    compile_ms_total: float = 0.0


class MemoryCompiler:
    """Compiles memories into reusable key/value caches for one backbone and layout.

    Cache key: backbone name and dtype, the layout's head, the memory id (which
    carries the entry version, e.g. ``"project/db/engine@v3"``) and a hash of
    the text; any of them changing means a new compile, never a stale cache.
    Bounded: at most ``max_entries_in_memory`` entries and, if given,
    ``max_bytes_in_memory`` bytes in memory; at most ``max_disk_bytes`` on disk,
    least recently used evicted first. Thread-safe; forward passes are serialised.
    """

    def __init__(self, backbone: Backbone, layout: PromptLayout | None = None, *,
                 max_entries_in_memory: int = 512, max_bytes_in_memory: int | None = None,
                 disk_dir: str | os.PathLike | None = None, max_disk_bytes: int = 2 << 30,
                 key_scale: float = DEFAULT_KEY_SCALE):
        if max_entries_in_memory < 1:
            raise ValueError("max_entries_in_memory must be >= 1")
        self.backbone = backbone
        self.layout = layout or PromptLayout.for_tokenizer(backbone.tokenizer)
        self.max_entries_in_memory = max_entries_in_memory
        self.max_bytes_in_memory = max_bytes_in_memory
        self.max_disk_bytes = max_disk_bytes
        self.key_scale = key_scale
        self.disk_dir = Path(disk_dir) if disk_dir is not None else None
        self.stats = CompilerStats()
        self._inv_freq = backbone.rope_inv_freq()
        self._lru: OrderedDict[str, CompiledMemory] = OrderedDict()
        self._lru_bytes = 0
        self._lock = threading.RLock()
        self._head: CompiledMemory | None = None
        self._disk_bytes = 0
        if self.disk_dir is not None:
            self.disk_dir.mkdir(parents=True, exist_ok=True)
            self._disk_bytes = sum(f.stat().st_size for f in self.disk_dir.glob("*.safetensors"))

    # -- keys ---------------------------------------------------------------

    def cache_key(self, memory_id: str, text: str) -> str:
        text_hash = hashlib.sha256(text.encode()).hexdigest()
        parts = [_FORMAT, self.backbone.name, str(self.backbone.dtype), self.layout.fingerprint, memory_id, text_hash]
        return hashlib.sha256(json.dumps(parts).encode()).hexdigest()

    # -- compiling ----------------------------------------------------------

    @property
    def head(self) -> CompiledMemory:
        with self._lock:
            if self._head is None:
                ids = encode(self.backbone, self.layout.head)
                self._head = self._run(_HEAD_ID, self.cache_key(_HEAD_ID, self.layout.head), ids, past=None,
                                       line=self.layout.head)
            return self._head

    def compile(self, memory_id: str, text: str) -> CompiledMemory:
        """The compiled cache of one memory, from memory, disk, or one forward pass."""
        key = self.cache_key(memory_id, text)
        with self._lock:
            hit = self._lru.get(key)
            if hit is not None:
                self._lru.move_to_end(key)
                self.stats.memory_hits += 1
                return hit
            compiled = self._load_from_disk(key, memory_id)
            if compiled is not None:
                self.stats.disk_hits += 1
            else:
                head = self.head
                line = self.layout.memory_line(text)
                compiled = self._run(memory_id, key, encode(self.backbone, line), past=head, line=line)
                self._save_to_disk(compiled)
            self._remember(compiled)
            return compiled

    def _run(self, memory_id: str, key: str, ids: list[int], past: CompiledMemory | None,
             line: str) -> CompiledMemory:
        """One forward pass over ``ids``, after ``past`` when given; keep the new keys/values."""
        bb = self.backbone
        start = time.perf_counter()
        base = past.n_tokens if past is not None else 0
        cache = DynamicCache(ddp_cache_data=[(k[None], v[None]) for k, v in zip(past.keys, past.values)]) \
            if past is not None else DynamicCache()
        with torch.inference_mode():
            input_ids = torch.tensor([ids], device=bb.device)
            bb.model(input_ids=input_ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        # .clone() so the kept slice does not pin the whole (head + memory) buffer.
        keys = [layer.keys[0, :, base:, :].clone() for layer in cache.layers]
        values = [layer.values[0, :, base:, :].clone() for layer in cache.layers]
        ms = (time.perf_counter() - start) * 1000
        self.stats.compiled += 1
        self.stats.compile_ms_total += ms
        return CompiledMemory(memory_id=memory_id, cache_key=key, token_ids=list(ids), keys=keys, values=values,
                              base_position=base, compile_ms=ms, origin="compiled", line=line)

    # -- bounds -------------------------------------------------------------

    def _remember(self, compiled: CompiledMemory) -> None:
        self._lru[compiled.cache_key] = compiled
        self._lru_bytes += compiled.nbytes
        while len(self._lru) > self.max_entries_in_memory or (
                self.max_bytes_in_memory is not None and self._lru_bytes > self.max_bytes_in_memory
                and len(self._lru) > 1):
            _, evicted = self._lru.popitem(last=False)
            self._lru_bytes -= evicted.nbytes
            self.stats.memory_evictions += 1

    def __len__(self) -> int:
        return len(self._lru)

    @property
    def bytes_in_memory(self) -> int:
        return self._lru_bytes

    @property
    def bytes_on_disk(self) -> int:
        return self._disk_bytes

    # -- disk ---------------------------------------------------------------

    def _path(self, key: str) -> Path:
        assert self.disk_dir is not None
        return self.disk_dir / f"{key}.safetensors"

    def _save_to_disk(self, compiled: CompiledMemory) -> None:
        if self.disk_dir is None:
            return
        tensors = {}
        for i, (k, v) in enumerate(zip(compiled.keys, compiled.values)):
            tensors[f"k.{i}"] = k.contiguous()
            tensors[f"v.{i}"] = v.contiguous()
        metadata = {
            "format": str(_FORMAT), "backbone": self.backbone.name, "memory_id": compiled.memory_id,
            "token_ids": json.dumps(compiled.token_ids), "base_position": str(compiled.base_position),
            "line": compiled.line,
        }
        path = self._path(compiled.cache_key)
        tmp = path.with_suffix(f".tmp{os.getpid()}.{threading.get_ident()}")
        save_file(tensors, str(tmp), metadata=metadata)
        os.replace(tmp, path)  # atomic: readers never see a partial file
        self._disk_bytes += path.stat().st_size
        self._evict_disk()

    def _load_from_disk(self, key: str, memory_id: str) -> CompiledMemory | None:
        if self.disk_dir is None:
            return None
        path = self._path(key)
        if not path.is_file():
            return None
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
        if metadata.get("format") != str(_FORMAT) or metadata.get("memory_id") != memory_id:
            return None
        tensors = load_file(str(path), device=str(self.backbone.device))
        n_layers = self.backbone.num_layers
        os.utime(path)  # mtime is the on-disk LRU clock
        return CompiledMemory(
            memory_id=memory_id, cache_key=key, token_ids=json.loads(metadata["token_ids"]),
            keys=[tensors[f"k.{i}"] for i in range(n_layers)], values=[tensors[f"v.{i}"] for i in range(n_layers)],
            base_position=int(metadata["base_position"]), origin="disk", line=metadata.get("line", ""))

    def _evict_disk(self) -> None:
        if self._disk_bytes <= self.max_disk_bytes:
            return
        files = sorted(self.disk_dir.glob("*.safetensors"), key=lambda f: f.stat().st_mtime_ns)
        for f in files[:-1]:  # never evict the file just written
            if self._disk_bytes <= self.max_disk_bytes:
                break
            size = f.stat().st_size
            f.unlink(missing_ok=True)
            self._disk_bytes -= size
            self.stats.disk_evictions += 1

    # -- prefixes -----------------------------------------------------------

    def build_prefix(self, memories: Sequence[CompiledMemory], key_scale: float | None = None) -> Prefix:
        """Head + ``memories`` in order as one cache, keys re-rotated to their new positions.

        ``key_scale`` (default: the compiler's ``key_scale``) multiplies the keys
        of every memory after the first, and so the attention logits towards
        them: a softmax temperature of ``1 / key_scale`` on those tokens. The
        first memory's cache is exact and never scaled; the module docstring
        says why the others are.
        """
        scale = self.key_scale if key_scale is None else key_scale
        start = time.perf_counter()
        head = self.head
        segments = [(head.memory_id, 0, head.n_tokens)]
        token_ids = list(head.token_ids)
        deltas: list[int] = []
        position = head.n_tokens
        for mem in memories:
            deltas.extend([position - mem.base_position] * mem.n_tokens)
            segments.append((mem.memory_id, position, position + mem.n_tokens))
            token_ids.extend(mem.token_ids)
            position += mem.n_tokens
        keys, values = [], []
        if memories:
            # One rotation per layer over all memory tokens at once: the shifts
            # are the same in every layer, and a call per memory per layer
            # would cost more than the prefill it replaces.
            delta = torch.tensor(deltas)
            first = memories[0].n_tokens
            for layer in range(len(head.keys)):
                k = rerotate_keys(torch.cat([m.keys[layer] for m in memories], dim=1), delta, self._inv_freq)
                if scale != 1.0 and len(memories) > 1:
                    k = torch.cat((k[:, :first], k[:, first:] * scale), dim=1)
                keys.append(torch.cat((head.keys[layer], k), dim=1)[None])
                values.append(torch.cat([head.values[layer], *(m.values[layer] for m in memories)], dim=1)[None])
        else:
            keys = [k[None] for k in head.keys]
            values = [v[None] for v in head.values]
        return Prefix(keys=keys, values=values, token_ids=token_ids, layout=self.layout, segments=segments,
                      build_ms=(time.perf_counter() - start) * 1000,
                      text=head.line + "".join(m.line for m in memories))


# ---------------------------------------------------------------------------
# Generation
# ---------------------------------------------------------------------------

@dataclass
class GenerationMetrics:
    """What one answer cost. Times are wall-clock ms; ``generate_ms`` includes ``ttft_ms``."""

    input_tokens: int  # tokens prefilled by this call
    prefix_tokens: int  # tokens reused from compiled caches (0 for text modes)
    new_tokens: int
    ttft_ms: float  # start of the call to the first generated token
    generate_ms: float  # whole call: prefix assembly, prefill, decoding
    prefix_build_ms: float = 0.0
    # Compiled tokens dropped because the pieces tokenized apart differ from the whole prompt tokenized at
    # once (a tokenizer merging across a boundary); re-prefilled with the suffix. 0: the pieces agree.
    retokenized_tokens: int = 0
    token_ids: list[int] = field(default_factory=list, repr=False)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("token_ids")
        return d


def _greedy(backbone: Backbone, input_ids: list[int], cache: DynamicCache, max_new_tokens: int,
            started: float, cancel: threading.Event | None = None) -> tuple[list[int], float]:
    """Prefill ``input_ids`` after ``cache``, then one forward per new token; greedy, stops at EOS/end-of-turn,
    or before the next token once ``cancel`` is set (the caller gave up: the worker is free for the next call)."""
    model, stops = backbone.model, set(backbone.stop_token_ids)
    out: list[int] = []
    ttft_ms = 0.0
    with torch.inference_mode():
        step = torch.tensor([input_ids], device=backbone.device)
        for i in range(max_new_tokens):
            if cancel is not None and cancel.is_set():
                break
            logits = model(input_ids=step, past_key_values=cache, use_cache=True, logits_to_keep=1).logits
            token = int(logits[0, -1].argmax())  # .item() also synchronises CUDA, so timings are real
            if i == 0:
                ttft_ms = (time.perf_counter() - started) * 1000
            if token in stops:
                break
            out.append(token)
            step = torch.tensor([[token]], device=backbone.device)
    return out, ttft_ms


def joint_tokens(backbone: Backbone, prefix: Prefix, suffix_text: str) -> tuple[int, list[int]]:
    """How many of the prefix's compiled tokens to keep, and the tokens to prefill after them.

    The pieces (head, each memory line, the suffix) are tokenized apart, but the
    text modes tokenize the whole prompt at once; a tokenizer that merges across
    a boundary (Qwen2's byte-level BPE joins the last memory's "\n" and the
    suffix's "\n" into one "\n\n" token) would hand the prefix mode another
    token sequence. Checked on every call (tokenizing is microseconds next to a
    forward pass): where they differ, the compiled tokens are kept up to the
    first difference and the rest of the whole prompt's tokens are prefilled,
    so the model reads exactly what the text modes read.
    """
    suffix_ids = encode(backbone, suffix_text)
    if not prefix.text:  # a prefix assembled without its text (none of this module's): nothing to check
        return prefix.n_tokens, suffix_ids
    whole = encode(backbone, prefix.text + suffix_text)
    if whole[:prefix.n_tokens] == prefix.token_ids and whole[prefix.n_tokens:] == suffix_ids:
        return prefix.n_tokens, suffix_ids
    keep = 0
    for mine, theirs in zip(prefix.token_ids, whole):
        if mine != theirs:
            break
        keep += 1
    keep = min(keep, len(whole) - 1)  # at least one token to prefill, or there is no logit to start from
    return keep, whole[keep:]


def generate_with_prefix(backbone: Backbone, prefix: Prefix, question_text: str, max_new_tokens: int = 64,
                         text_memories: Sequence[str] = (),
                         cancel: threading.Event | None = None) -> tuple[str, GenerationMetrics]:
    """Answer ``question_text`` after a compiled prefix, prefilling only the suffix.

    ``text_memories`` are placed as ordinary note lines after the compiled ones
    and prefilled with the question (the hybrid mode: they attend to every
    compiled memory and sit closest to the question). The time to assemble the
    prefix (``prefix.build_ms``) is counted in ``ttft_ms`` and ``generate_ms``.
    Where the pieces tokenize differently from the whole prompt, the boundary is
    re-prefilled (``joint_tokens``; ``metrics.retokenized_tokens`` says how many).
    """
    started = time.perf_counter() - prefix.build_ms / 1000
    keep, suffix_ids = joint_tokens(backbone, prefix, prefix.layout.suffix(question_text, text_memories))
    cache = prefix.to_cache(keep)
    tokens, ttft_ms = _greedy(backbone, suffix_ids, cache, max_new_tokens, started, cancel)
    total_ms = (time.perf_counter() - started) * 1000
    answer = backbone.tokenizer.decode(tokens, skip_special_tokens=True).strip()
    return answer, GenerationMetrics(input_tokens=len(suffix_ids), prefix_tokens=keep,
                                     new_tokens=len(tokens), ttft_ms=ttft_ms, generate_ms=total_ms,
                                     prefix_build_ms=prefix.build_ms, retokenized_tokens=prefix.n_tokens - keep,
                                     token_ids=tokens)


def generate_text(backbone: Backbone, prompt_messages: list[dict[str, str]],
                  max_new_tokens: int = 64, cancel: threading.Event | None = None) -> tuple[str, GenerationMetrics]:
    """Answer from a plain chat prompt (modes D and B), with the same decoding loop."""
    started = time.perf_counter()
    text = backbone.tokenizer.apply_chat_template(prompt_messages, tokenize=False, add_generation_prompt=True)
    ids = encode(backbone, text)
    tokens, ttft_ms = _greedy(backbone, ids, DynamicCache(), max_new_tokens, started, cancel)
    total_ms = (time.perf_counter() - started) * 1000
    answer = backbone.tokenizer.decode(tokens, skip_special_tokens=True).strip()
    return answer, GenerationMetrics(input_tokens=len(ids), prefix_tokens=0, new_tokens=len(tokens),
                                     ttft_ms=ttft_ms, generate_ms=total_ms, token_ids=tokens)
