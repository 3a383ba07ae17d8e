"""The README's ML section documents every ML tool, the minimum-data table, where models live and the
benchmark, and its Python program runs as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from amfs_server.tools.ml_tools import ML_TOOLS

README = Path(__file__).resolve().parents[2] / "README.md"


def ml_section() -> str:
    match = re.search(r"<!-- ml:start -->(.*?)<!-- ml:end -->", README.read_text(encoding="utf-8"), re.S)
    assert match, "README has no ML section"
    return match.group(1)


def test_readme_ml_section_documents_tools_minimums_model_storage_and_benchmark() -> None:
    section = ml_section()
    assert set(re.findall(r"^\|\s*`(amfs_\w+)`\s*\|", section, flags=re.MULTILINE)) == ML_TOOLS
    for needle in [
        "AMFS_ML_MODEL_DIR", "ml.ranker_models", "ml.version", "20 outcome-linked samples", "5 outcomes per type",
        "2+ entries", "1 clean and 1 failed trace", "1 outcome-linked entry", "30%", "apply=true", "revert=true",
        "apply_refused", "python -m amfs_server.session_bench.ml_bench --sessions 1200 --seeds",
        "--scenarios drift static", "pytest tests/ml",
    ]:
        assert needle in section, needle


def test_the_readme_ml_program_runs_as_written(tmp_path: Path) -> None:
    programs = re.findall(r"```python\n(.*?)```", ml_section(), re.S)
    assert len(programs) == 1, "the ML section has one Python program"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3]), "OMP_WAIT_POLICY": "PASSIVE"}
    result = subprocess.run(
        [sys.executable, "-c", programs[0]], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert "ranker accuracy" in result.stdout and "SFT examples" in result.stdout
