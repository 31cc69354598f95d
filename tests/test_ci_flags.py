"""The suite's own pytest flags (the Makefile's PYTEST_FLAGS) end a run whose worker crashed:
it fails, naming the test, instead of hanging with idle workers until CI's limit."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import time

from tests.conftest import REPO

CRASH = "import os\n\ndef test_crash():\n    os._exit(3)\n\ndef test_after_crash():\n    pass\n"
SLOW = "import time\n\ndef test_one():\n    time.sleep(1)\n\ndef test_two():\n    time.sleep(1)\n"


def makefile_flags() -> list[str]:
    m = re.search(r"^PYTEST_FLAGS :=(.*)$", (REPO / "Makefile").read_text(), re.M)
    assert m, "the Makefile declares PYTEST_FLAGS"
    return shlex.split(m.group(1))


def test_a_crashed_worker_fails_the_run_at_once(tmp_path):
    (tmp_path / "test_crash.py").write_text(CRASH)
    (tmp_path / "test_slow.py").write_text(SLOW)
    (tmp_path / "conftest.py").write_text("")
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pytest", *makefile_flags(), "-n", "2", str(tmp_path)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=240)
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    assert "crashed while running 'test_crash.py::test_crash'" in out, out
    assert time.monotonic() - t0 < 200, out
