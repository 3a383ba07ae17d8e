"""scripts/embed_batches.py: one text at a time against batches, with the real default embedder on a few turns."""

from __future__ import annotations

import pytest

from .scripts_dir import script


def test_it_compares_batched_vectors_with_each_text_alone(capsys):
    script("embed_batches").main(["--sizes", "3", "--turns", "6", "--repeats", "1"])
    out = capsys.readouterr().out
    assert out.startswith("6 turns, chat-mpnet-int8; one at a time:")
    row = next(line for line in out.splitlines() if line.startswith("| 3 |"))
    cosine, component, regrouped, per_text = (float(cell) for cell in row.strip("| ").split(" | ")[1:])
    assert 0.99 < cosine <= 1.0001 and 0.0 <= component < 0.05 and 0.0 <= regrouped < 0.05 and per_text > 0


def test_it_refuses_a_batch_of_one():
    with pytest.raises(SystemExit):
        script("embed_batches").main(["--sizes", "1"])
