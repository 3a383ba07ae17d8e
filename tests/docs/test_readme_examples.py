"""Every ```python block in the README runs as written, each in a fresh directory, and prints what its
`print(...)  # claim` comments say. Blocks are found wherever they are (any section, any author)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
_FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)


def python_blocks(text: str) -> list[tuple[int, str]]:
    """(line number of the opening fence, code) for each ```python block."""
    return [(text.count("\n", 0, match.start()) + 1, match.group(1)) for match in _FENCE.finditer(text)]


def test_blocks_are_found_with_their_line_numbers() -> None:
    text = "intro\n```python\nprint(1)\n```\n\n```bash\nls\n```\n```python\nx = 2\n```\n"
    assert python_blocks(text) == [(2, "print(1)\n"), (9, "x = 2\n")]


BLOCKS = python_blocks(README.read_text(encoding="utf-8"))


def test_the_readme_has_python_examples() -> None:
    assert BLOCKS


@pytest.mark.parametrize(("line", "block"), BLOCKS, ids=[f"README.md:{line}" for line, _ in BLOCKS])
def test_readme_python_block_runs_and_prints_what_it_claims(line: int, block: str, tmp_path: Path) -> None:
    # no AMFS_* from the caller's shell: a block runs on its own store in tmp_path, as on a fresh machine
    env = {name: value for name, value in os.environ.items() if not name.startswith("AMFS_")}
    env["AMFS_DATA_DIR"] = str(tmp_path / "amfs-data")
    result = subprocess.run(
        [sys.executable, "-c", block], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, f"README.md:{line}: the ```python block failed:\n{result.stderr}"
    claimed = [
        line_text.split("#", 1)[1].strip()
        for line_text in block.splitlines()
        if line_text.strip().startswith("print(") and "#" in line_text
    ]
    for claim in claimed:
        assert claim in result.stdout, f"README.md:{line}: claims {claim!r}; the block printed:\n{result.stdout}"
