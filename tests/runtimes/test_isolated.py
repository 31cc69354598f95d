"""The isolated runner: a registered runner loaded and run in a child process; crashes, timeouts
and errors raised in the child come back as clean ModelportErrors."""

from __future__ import annotations

import numpy as np
import pytest

from modelport.errors import BadInputError
from modelport.runtimes.isolated import IsolatedRunner, call_in_child
from tests.runtimes.crash_injection import inject_crash
from tests.tflite_models import write_two_input_tflite


@pytest.fixture(scope="module")
def tflite_file(tmp_path_factory):
    return write_two_input_tflite(tmp_path_factory.mktemp("iso") / "two.tflite")


def _feeds():
    rng = np.random.default_rng(0)
    return {"a": rng.standard_normal((3, 4, 2)).astype(np.float32), "b": rng.standard_normal((3, 2)).astype(np.float32)}


def test_same_outputs_as_in_process(tflite_file):
    from modelport.runtimes import get_runner

    feeds = _feeds()
    isolated = IsolatedRunner("tflite", tflite_file)
    got = isolated.run(feeds)
    want = get_runner("tflite", tflite_file).run(feeds)
    assert list(got) == list(want)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
    np.testing.assert_allclose(next(iter(got.values())), feeds["a"].sum(axis=1) * 10 + feeds["b"], rtol=1e-5)
    info = isolated.describe()
    assert [d["dtype"] for d in info["inputs"]] == ["float32", "float32"]
    assert sorted(len(d["shape_signature"]) for d in info["inputs"]) == [2, 3]


def test_error_raised_in_child_keeps_its_class(tflite_file):
    with pytest.raises(BadInputError, match="takes 2") as e:
        IsolatedRunner("tflite", tflite_file).run({"x": np.zeros((1, 2), np.float32)})
    assert e.value.exit_code == 2


@pytest.mark.parametrize("sig", ["SIGSEGV", "SIGABRT"])
def test_signal_death_in_the_runtime_is_a_bad_input(tflite_file, monkeypatch, tmp_path, sig):
    inject_crash(monkeypatch, tmp_path / "hook", "modelport.runtimes.tflite:load_interpreter", sig)
    with pytest.raises(BadInputError, match=f"crashed \\({sig}\\)") as e:
        IsolatedRunner("tflite", tflite_file).run(_feeds())
    assert e.value.exit_code == 2 and "two.tflite" in e.value.message


def test_timeout_from_environment(tflite_file, monkeypatch):
    # 1 ms: no Python child can even start in that time, so the timeout always fires.
    monkeypatch.setenv("MODELPORT_CHILD_TIMEOUT", "0.001")
    with pytest.raises(BadInputError, match="did not finish within 0.001 s"):
        IsolatedRunner("tflite", tflite_file).run(_feeds())


def test_unexpected_exception_in_child(tmp_path):
    with pytest.raises(BadInputError, match="ModuleNotFoundError"):
        call_in_child("modelport.no_such_module:f", {}, path=tmp_path / "m.bin", what="the loader")
