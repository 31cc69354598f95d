"""A stage that runs away in time or memory fails naming itself, what it held and the flag that
raises its bound (exit 2), with nothing written; the bounds hold by default and are overridable."""

from __future__ import annotations

import time

import pytest

from modelport import stage_limits, targets
from modelport.errors import BadInputError
from tests import tiny_target


@pytest.fixture
def runaway():
    with targets.registered(tiny_target.TINY_RUNAWAY) as t:
        yield t
    tiny_target.Runaway.held.clear()


def _error_line(stderr: str) -> str:
    (line,) = [ln for ln in stderr.splitlines() if ln.startswith("error:")]
    return line


def test_a_stage_past_its_time_bound_stops_naming_itself(runaway, tiny_onnx, tmp_path, cli):
    start = time.monotonic()
    # a bound the other stages keep on a loaded machine too; the runaway stops itself only after 120 s
    r = cli("convert", tiny_onnx, "--to", "tiny-runaway", "-o", tmp_path / "out", "--stage-timeout", "20")
    assert r.exit_code == 2, r.stderr
    assert time.monotonic() - start < 100
    line = _error_line(r.stderr)
    assert "stage 'emit:tiny-runaway' ran" in line and "past its bound of 20 s" in line and "--stage-timeout SECONDS" in line
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.staging-*"))


def test_the_time_bound_holds_under_another_sigint_handler(runaway, tiny_onnx, tmp_path, cli):
    """A library that installed its own SIGINT handler earlier in the process (a server's) does not
    turn the bound's interrupt into a hard stop of the whole process: the stage still fails with
    exit 2, and the handler is back afterwards."""
    import signal

    calls = []

    def handler(signum, frame):
        calls.append(signum)

    previous = signal.signal(signal.SIGINT, handler)
    try:
        r = cli("convert", tiny_onnx, "--to", "tiny-runaway", "-o", tmp_path / "out", "--stage-timeout", "3")
        assert r.exit_code == 2, r.stderr
        assert "past its bound of 3 s" in _error_line(r.stderr)
        assert signal.getsignal(signal.SIGINT) is handler and calls == []
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_stage_past_its_memory_bound_stops_naming_what_it_held(runaway, tiny_onnx, tmp_path, cli, monkeypatch):
    monkeypatch.setattr(tiny_target.Runaway, "mode", "memory")
    r = cli("convert", tiny_onnx, "--to", "tiny-runaway", "-o", tmp_path / "out", "--stage-memory", "400M", "--json")
    assert r.exit_code == 2, r.stderr
    line = _error_line(r.stderr)
    assert "stage 'emit:tiny-runaway' took" in line and "more memory" in line and "past its bound of 419 MB" in line
    assert "--stage-memory SIZE" in line
    assert r.json()["error"]["type"] == "StageLimitError" and not (tmp_path / "out").exists()


def test_the_default_bounds_follow_the_model(monkeypatch):
    monkeypatch.delenv(stage_limits.TIME_ENV, raising=False)
    monkeypatch.delenv(stage_limits.MEMORY_ENV, raising=False)
    small = stage_limits.Limits.of()
    assert small.seconds == stage_limits.DEFAULT_SECONDS and small.memory <= stage_limits.MEMORY_FLOOR
    big = stage_limits.Limits.of(model_bytes=2 << 30)
    assert big.memory == min(stage_limits.MEMORY_BASE + 8 * (2 << 30), stage_limits._total() or big.memory)
    monkeypatch.setenv(stage_limits.TIME_ENV, "90")
    monkeypatch.setenv(stage_limits.MEMORY_ENV, "12G")
    assert stage_limits.Limits.of() == stage_limits.Limits(90.0, 12 << 30)
    with pytest.raises(BadInputError, match="bad --stage-memory"):
        stage_limits.Limits.of(memory="lots")
    with pytest.raises(BadInputError, match="bad --stage-timeout"):
        stage_limits.Limits.of(seconds=-1)
