"""The project's research scripts (scripts/*.py, not a package) loaded as modules for their tests."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None, f"scripts/{name}.py is missing"
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def random_mpnet(folder: Path, tokenizer_json: Path, pad_token: str, **config: int) -> Path:
    """A randomly initialised (seed 0) MPNetModel of `config`'s shape saved in transformers format in `folder`,
    with `tokenizer_json` as its tokenizer: a stand-in for a fine-tuned mpnet folder in the scripts' tests."""
    import shutil

    import torch
    from transformers import MPNetConfig, MPNetModel, PreTrainedTokenizerFast

    torch.manual_seed(0)
    MPNetModel(MPNetConfig(vocab_size=30527, **config)).eval().save_pretrained(str(folder))
    PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_json), pad_token=pad_token).save_pretrained(str(folder))
    shutil.copy(tokenizer_json, folder / "tokenizer.json")
    return folder
