"""modelport.run.memory: the process tree's peak RSS during a stage (report.json's `peak_rss`) and the
memory available to a run."""

from __future__ import annotations

import json

import pytest

from modelport.errors import BadInputError
from modelport.run import memory
from modelport.validation.report import SCHEMA_FILE
from tests.alone import run_alone

MB = 1 << 20


PRELUDE = """
import json, resource, subprocess, sys, time
import numpy as np
from modelport.run import memory
MB = 1 << 20
"""


def test_a_window_sees_memory_this_process_touched_and_let_go():
    run_alone(PRELUDE + """
w = memory.window()
before = w.peak
block = np.ones(300 * MB, dtype=np.uint8)  # touched: resident
time.sleep(3 * memory.INTERVAL)  # a sample falls while it is held (the high-water mark may be older)
del block
peak = w.close()
assert peak >= before + 280 * MB, (peak, before)
assert w.close() == peak  # closing again keeps the figure
memory.wait_idle()
assert memory._sampler._thread is None  # no thread left once every window is closed
""")


def test_a_window_sees_a_child_process_while_it_runs():
    run_alone(PRELUDE + """
w = memory.window()
before = w.peak
subprocess.run([sys.executable, "-c", "import numpy as np, time; b = np.ones(250 << 20, np.uint8); time.sleep(0.6)"],
               check=True)
peak = w.close()
assert peak >= before + 230 * MB, (peak, before)
""")


def test_a_small_child_of_a_process_that_once_held_much_is_counted_as_small():
    """On some kernels (Linux 6.18 here) a child started by fork/vfork and exec reports its parent's
    high-water mark as its own (RUSAGE_CHILDREN); others do not carry it. The window reads the tree
    instead, so validation's child is never counted at the size the converter once had, whichever
    kernel runs it. (Where the kernel carries the mark, the old window failed this.)"""
    run_alone(PRELUDE + """
block = np.ones(400 * MB, dtype=np.uint8)
del block
high = memory.own_peak()
w = memory.window()
subprocess.run([sys.executable, "-c", "pass"], check=True)
carried = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024 >= 0.9 * high
peak = w.close()
assert peak < high - 300 * MB, (peak, high, carried)
""")


def test_a_process_high_water_mark_is_its_own_not_its_parents():
    """A child started by a process holding 400 MB reports its own peak (the memory tests' measure,
    and the report's): getrusage's ru_maxrss gives it the parent's mark on Linux 6.18."""
    out = run_alone(PRELUDE + """
block = np.ones(400 * MB, dtype=np.uint8)
child = subprocess.run([sys.executable, "-c", "from modelport.run.memory import own_peak; print(own_peak())"],
                       capture_output=True, text=True, check=True)
print(int(child.stdout), memory.own_peak())
""")
    child, parent = map(int, out.split())
    assert child < 150 * MB and parent > 400 * MB, (child, parent)


def test_report_stages_carry_their_peak_and_the_run_its_largest():
    import jsonschema

    out = run_alone(PRELUDE + """
from modelport.validation.report import Report
report = Report("convert")
with report.stage("small"):
    pass
with report.stage("large"):
    block = np.ones(200 * MB, dtype=np.uint8)
    time.sleep(3 * memory.INTERVAL)  # a sample falls while it is held (the high-water mark may be older)
    del block
print(json.dumps(report.finish()))
""")
    doc = json.loads(out.strip().splitlines()[-1])
    small, large = doc["stages"]
    assert large["peak_rss"] >= small["peak_rss"] + 150 * MB
    assert doc["peak_rss"] == large["peak_rss"]
    jsonschema.validate(doc, json.loads(SCHEMA_FILE.read_text()))


@pytest.mark.parametrize(("text", "size"), [("1048576", MB), ("512M", 512 * MB), ("1.5G", 1536 * MB), ("2 GiB", 2048 * MB),
                                            ("3t", 3 << 40)])
def test_sizes(text, size):
    assert memory.parse_size(text) == size


def test_available_memory_can_be_set(monkeypatch):
    monkeypatch.delenv(memory.AVAILABLE_ENV, raising=False)
    real = memory.available()
    assert real is not None and real > 0
    monkeypatch.setenv(memory.AVAILABLE_ENV, "3G")
    assert memory.available() == 3 << 30
    monkeypatch.setenv(memory.AVAILABLE_ENV, "lots")
    with pytest.raises(BadInputError, match=memory.AVAILABLE_ENV):
        memory.available()
