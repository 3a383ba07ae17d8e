"""The README's learning section documents every learning tool, switch, environment variable and command."""

from __future__ import annotations

import re
from pathlib import Path

from amfs_server.server.config_file import ENV_OVERRIDES
from amfs_server.tools.learning_tools import LEARNING_TOOLS

README = Path(__file__).resolve().parents[2] / "README.md"


def learning_section() -> str:
    text = README.read_text(encoding="utf-8")
    match = re.search(r"<!-- learning:start -->(.*?)<!-- learning:end -->", text, re.S)
    assert match, "README has no learning section"
    return match.group(1)


def test_readme_learning_section_documents_tools_switches_variables_and_commands() -> None:
    section = learning_section()
    rows = set(re.findall(r"^\|\s*`(amfs_\w+)`\s*\|", section, flags=re.MULTILINE))
    assert rows == LEARNING_TOOLS
    for needle in [
        *ENV_OVERRIDES, "AMFS_CONFIG", "--no-learning", "--no-preference-learning", "--no-pattern-detection",
        "amfs-server config show", "amfs-server memory show", "amfs-server memory forget", "amfs-server memory export",
        "amfs-server memory import", "amfs-server memory clear", "1 - 0.6 * 0.7^(n-1)", "[REDACTED]",
    ]:
        assert needle in section, needle
