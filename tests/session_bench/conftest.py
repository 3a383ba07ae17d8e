"""Fixtures shared by the scripts' tests."""

from __future__ import annotations

import pytest

from .scripts_dir import ROOT, random_mpnet


@pytest.fixture(scope="session")
def small_mpnet(tmp_path_factory):
    """A random mpnet of the shipped width (768), vocabulary and tokenizer; two layers keep an export to seconds."""
    pytest.importorskip("onnx")
    pytest.importorskip("tokenizers")
    return random_mpnet(tmp_path_factory.mktemp("small-mpnet"), ROOT / "adapters" / "models" / "chat-mpnet" /
                        "tokenizer.json", "<pad>", hidden_size=768, num_hidden_layers=2, num_attention_heads=12,
                        intermediate_size=256)


@pytest.fixture(scope="module")
def one_thread():
    """The tiny models' tests on one torch thread (two shared cores: threads fight more than they help)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
