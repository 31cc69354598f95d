"""A stage that runs away in time or memory fails naming itself, what it held and the flag that
raises its bound (exit 2), with nothing written; the bounds hold by default and are overridable."""

from __future__ import annotations

import time

import pytest

from modelport import targets
from modelport.errors import BadInputError
from modelport.run import stage_limits
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


def test_by_default_a_stage_stops_before_the_machine_runs_out(runaway, tiny_onnx, tmp_path, cli, monkeypatch):
    """No --stage-memory: a stage that would take more than the machine has available (here said
    to be 1.5 GiB) stops with one line naming that figure and the margin, before the kernel's OOM
    killer would end the run without a word."""
    monkeypatch.setattr(tiny_target.Runaway, "mode", "memory")
    monkeypatch.delenv(stage_limits.MEMORY_ENV, raising=False)
    monkeypatch.setenv("MODELPORT_AVAILABLE_MEMORY", "1536M")
    r = cli("convert", tiny_onnx, "--to", "tiny-runaway", "-o", tmp_path / "out", "--json")
    assert r.exit_code == 2, r.stderr
    line = _error_line(r.stderr)
    assert "stage 'emit:tiny-runaway' took" in line and "past the 537 MB the machine could give" in line, line
    assert "1.6 GB available, less a margin of 1.1 GB" in line and "--stage-memory SIZE" in line
    assert not (tmp_path / "out").exists()


def test_the_default_memory_bound_is_what_the_machine_can_give(monkeypatch):
    """By default a stage may take what the machine has available when it begins, less the margin:
    a Keras ResNet50's parse (6.5 GB above the run's start, 100 MB of weights) on a 24 GB machine
    is not refused; the flag and the environment still set the bound."""
    monkeypatch.delenv(stage_limits.TIME_ENV, raising=False)
    monkeypatch.delenv(stage_limits.MEMORY_ENV, raising=False)
    monkeypatch.setenv("MODELPORT_AVAILABLE_MEMORY", "20G")
    limits = stage_limits.Limits.of()
    assert limits.seconds == stage_limits.DEFAULT_SECONDS and limits.memory is None
    bound, said = limits.memory_at_start()
    assert bound == (20 << 30) - stage_limits.MEMORY_MARGIN and bound > 7.35e9
    assert "available, less a margin of 1.1 GB" in said
    monkeypatch.setenv("MODELPORT_AVAILABLE_MEMORY", "3G")
    assert stage_limits.Limits.of().memory_at_start()[0] == (3 << 30) - stage_limits.MEMORY_MARGIN
    monkeypatch.setenv(stage_limits.TIME_ENV, "90")
    monkeypatch.setenv(stage_limits.MEMORY_ENV, "12G")
    assert stage_limits.Limits.of() == stage_limits.Limits(90.0, 12 << 30)
    assert stage_limits.Limits.of().memory_at_start()[0] == 12 << 30
    with pytest.raises(BadInputError, match="bad --stage-memory"):
        stage_limits.Limits.of(memory="lots")
    with pytest.raises(BadInputError, match="bad --stage-timeout"):
        stage_limits.Limits.of(seconds=-1)
