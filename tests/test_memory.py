"""modelport.memory: the process tree's peak RSS during a stage (report.json's `peak_rss`) and the
memory available to a run."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np
import pytest

from modelport import memory
from modelport.errors import BadInputError
from modelport.validation.report import SCHEMA_FILE, Report

MB = 1 << 20


def test_a_window_sees_memory_this_process_touched_and_let_go():
    w = memory.window()
    before = w.peak
    block = np.ones(300 * MB, dtype=np.uint8)  # touched: resident
    time.sleep(3 * memory.INTERVAL)  # a sample falls while it is held (the high-water mark may be older)
    del block
    peak = w.close()
    assert peak >= before + 280 * MB
    assert w.close() == peak  # closing again keeps the figure
    memory.wait_idle()
    assert memory._sampler._thread is None  # no thread left once every window is closed


def test_a_window_sees_a_child_process_while_it_runs():
    w = memory.window()
    before = w.peak
    child = subprocess.run([sys.executable, "-c", "import numpy as np, time; b = np.ones(250 << 20, np.uint8); time.sleep(0.6)"],
                           check=True)
    assert child.returncode == 0
    assert w.close() >= before + 230 * MB


def test_a_small_child_of_a_process_that_once_held_much_is_counted_as_small():
    """A child started by fork/vfork and exec reports its parent's high-water mark as its own
    (RUSAGE_CHILDREN): the window reads the tree instead, so validation's child is not counted at
    the size the converter once had."""
    import resource

    block = np.ones(400 * MB, dtype=np.uint8)
    del block
    high = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    w = memory.window()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    assert resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024 >= 0.9 * high  # the inherited mark
    peak = w.close()
    assert peak < high - 300 * MB, (peak, high)


def test_report_stages_carry_their_peak_and_the_run_its_largest():
    import jsonschema

    report = Report("convert")
    with report.stage("small"):
        pass
    with report.stage("large"):
        block = np.ones(200 * MB, dtype=np.uint8)
        time.sleep(3 * memory.INTERVAL)  # a sample falls while it is held (the high-water mark may be older)
        del block
    doc = report.finish()
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
