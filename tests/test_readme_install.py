"""The README's by-hand install installs what `make setup` installs (same extras, same --no-deps steps)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _by_hand() -> str:
    text = (ROOT / "README.md").read_text()
    block = text.split("By hand:", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    return block.replace("\\\n", " ")


def _make_var(name: str) -> str:
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    return re.search(rf"^{name}\s*[:?]?=\s*(.*)$", text, flags=re.M).group(1)


def test_the_by_hand_install_matches_make_setup():
    block = _by_hand()
    extras = re.search(r'pip install -e "\.\[([^\]]+)\]"', block).group(1).split(",")
    assert extras == _make_var("EXTRAS").split(",")
    no_deps = [line.split("--no-deps", 1)[1].split("#")[0].split() for line in block.splitlines() if "--no-deps" in line]
    makefile = (ROOT / "Makefile").read_text()
    tf_keras = re.search(r'--no-deps "(tf_keras==[^"]+)"', makefile).group(1)
    assert [f'"{tf_keras}"'] in no_deps
    assert _make_var("LITERT_TORCH").split() in no_deps
    assert _make_var("PADDLE").split() in no_deps
    assert "nvidia-pytriton==0.7.0" in block and "nvidia-pytriton==0.7.0" in (ROOT / "Makefile").read_text()
