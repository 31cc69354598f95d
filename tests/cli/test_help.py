"""Help that teaches, checked in real processes: panels, one example per command, no `<type>` noise,
no flag cut short, and snapshots of every command's --help that catch drift.

After a deliberate change to a command's options, rewrite the snapshots with
`python -m tests.cli.test_help` and review the diff.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SNAPSHOTS = Path(__file__).resolve().parent / "help"
COMMANDS = ["", "convert", "inspect", "optimize", "emit", "validate", "package", "serve", "bench", "doctor", "zoo", "zoo list",
            "zoo build", "zoo fetch", "batch", "report", "report diff", "repo", "repo add", "repo promote", "repo rollback", "repo list"]


def help_text(command: str, columns: int = 100) -> str:
    env = {**os.environ, "COLUMNS": str(columns), "TERM": "dumb", "NO_COLOR": "1"}
    env.pop("TERMINAL_WIDTH", None)
    p = subprocess.run([sys.executable, "-m", "modelport", *command.split(), "--help"], capture_output=True, text=True,
                       env=env, timeout=60)
    assert p.returncode == 0, p.stderr
    return "\n".join(line.rstrip() for line in p.stdout.splitlines()).strip("\n") + "\n"


def _snapshot(command: str) -> Path:
    return SNAPSHOTS / f"{command.replace(' ', '_') or 'modelport'}.txt"


@pytest.mark.parametrize("command", COMMANDS)
def test_help_matches_its_snapshot(command):
    text = help_text(command)
    assert text == _snapshot(command).read_text(), f"help of '{command}' drifted: python -m tests.cli.test_help rewrites it"
    assert "<str>" not in text and "<bool>" not in text and "<int>" not in text and "<list" not in text
    if command and command not in ("zoo", "report", "repo"):  # groups: their commands carry the examples
        assert "Example:  modelport " + command in text


@pytest.mark.parametrize("command", ["convert", "optimize", "emit", "validate", "package", "bench"])
def test_no_flag_or_help_is_cut_short_at_80_columns(command):
    assert "…" not in help_text(command, columns=80)


def test_convert_groups_its_options_into_panels():
    text = help_text("convert")
    panels = [line.split("─ ", 1)[1].split(" ─")[0] for line in text.splitlines() if line.startswith("╭─ ")]
    assert panels == ["Arguments", "Options", "Source", "Targets", "Validation", "Optimisation", "FP16/INT8 details", "Output"]


def test_shell_completion_installs_and_completes(tmp_path):
    # the shell named on the command line, not detected from the process tree (pytest's parents vary: make, sh, nice)
    env = {**os.environ, "HOME": str(tmp_path), "SHELL": "/bin/bash", "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"}
    p = subprocess.run([sys.executable, "-m", "modelport", "--install-completion", "bash"], capture_output=True, text=True,
                       env=env, timeout=60)
    assert p.returncode == 0, p.stderr
    script = tmp_path / ".bash_completions" / "modelport.sh"
    assert script.is_file() and "_MODELPORT_COMPLETE" in script.read_text()
    assert str(script) in (tmp_path / ".bashrc").read_text()
    env = {**os.environ, "_MODELPORT_COMPLETE": "complete_bash", "COMP_WORDS": "modelport be", "COMP_CWORD": "1"}
    out = subprocess.run([sys.executable, "-m", "modelport"], capture_output=True, text=True, env=env, timeout=60).stdout
    assert out.split() == ["bench"]
    env = {**env, "COMP_WORDS": "modelport convert --tfl", "COMP_CWORD": "2"}
    out = subprocess.run([sys.executable, "-m", "modelport"], capture_output=True, text=True, env=env, timeout=60).stdout
    assert set(out.split()) == {"--tflite-layout", "--tflite-io-dtype"}


if __name__ == "__main__":
    SNAPSHOTS.mkdir(exist_ok=True)
    for c in COMMANDS:
        _snapshot(c).write_text(help_text(c))
        print("wrote", _snapshot(c))
