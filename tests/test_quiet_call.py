"""modelport.run.quiet_call: a converter's output goes into a log file for the call, and nothing bound
to that file during the call outlives it."""

from __future__ import annotations

import logging
import sys

from modelport.run.quiet_call import captured_output, read_log, silenced_output


def test_what_a_block_prints_goes_to_its_log(tmp_path, capfd):
    log = tmp_path / "tool.log"
    with captured_output(log):
        print("python line")
        sys.stderr.write("stderr line\n")
    assert read_log(log) == ["python line", "stderr line"]
    out, err = capfd.readouterr()
    assert "python line" not in out + err and "stderr line" not in out + err


def test_a_log_handler_bound_inside_a_block_never_writes_into_a_later_file(tmp_path, capfd):
    """A library that makes `logging.StreamHandler()` while its output is captured binds the stream
    sys.stderr is then. After the block that stream writes where stderr went before it, never
    through the block's closed descriptor, which the next file opened takes over (an artifact)."""
    logger = logging.getLogger("modelport.tests.a_chatty_library")
    logger.propagate = False
    for quiet in (lambda: captured_output(tmp_path / "tool.log"), silenced_output):
        handler = None
        try:
            with quiet():
                handler = logging.StreamHandler()
                logger.addHandler(handler)
                logger.warning("while captured")
            with open(tmp_path / "artifact.bin", "wb") as artifact:
                logger.warning("after the block")
                handler.flush()
                artifact.write(b"MODEL")
            assert (tmp_path / "artifact.bin").read_bytes() == b"MODEL"
            assert "after the block" in capfd.readouterr().err
        finally:
            if handler is not None:
                logger.removeHandler(handler)
    assert read_log(tmp_path / "tool.log") == ["while captured"]
