"""The README's ML section documents every ML tool, the minimum-data table, the model directory and the benchmark."""

from __future__ import annotations

import re
from pathlib import Path

from amfs_server.tools.ml_tools import ML_TOOLS

README = Path(__file__).resolve().parents[2] / "README.md"


def ml_section() -> str:
    match = re.search(r"<!-- ml:start -->(.*?)<!-- ml:end -->", README.read_text(encoding="utf-8"), re.S)
    assert match, "README has no ML section"
    return match.group(1)


def test_readme_ml_section_documents_tools_minimums_model_dir_and_benchmark() -> None:
    section = ml_section()
    assert set(re.findall(r"^\|\s*`(amfs_\w+)`\s*\|", section, flags=re.MULTILINE)) == ML_TOOLS
    for needle in [
        "AMFS_ML_MODEL_DIR", "ranker-global.txt", "20 outcome-linked samples", "5 outcomes per type",
        "2+ entries", "1 clean and 1 failed trace", "1 outcome-linked entry", "30%", "apply=true", "revert=true",
        "python -m amfs_server.session_bench.ml_bench --sessions 1200 --seed 0", "pytest tests/ml",
    ]:
        assert needle in section, needle
