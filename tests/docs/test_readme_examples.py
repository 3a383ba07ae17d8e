"""README examples run as written (each ```python block in a section, in a fresh directory)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


def python_blocks(section: str) -> list[str]:
    text = README.read_text(encoding="utf-8")
    match = re.search(rf"<!-- {section}:start -->(.*?)<!-- {section}:end -->", text, re.S)
    assert match, f"README has no {section} section"
    return re.findall(r"```python\n(.*?)```", match.group(1), re.S)


@pytest.mark.parametrize("section", ["sdk"])
def test_readme_python_examples_run_and_print_what_they_claim(section: str, tmp_path: Path) -> None:
    blocks = python_blocks(section)
    assert blocks
    for block in blocks:
        result = subprocess.run([sys.executable, "-c", block], cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr
        claimed = [
            (line.split("#", 1)[1].strip())
            for line in block.splitlines()
            if line.strip().startswith("print(") and "#" in line
        ]
        for claim in claimed:
            assert claim in result.stdout, f"README claims {claim!r}; the example printed:\n{result.stdout}"
