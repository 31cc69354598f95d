"""TensorFlow imported quietly (its log lines off, its stdout writes on stderr), and the reason in
its exceptions' text."""

from __future__ import annotations

import contextlib
import logging
import os
import sys

from modelport.deps import require
from modelport.errors import one_line


def tf_reason(e: BaseException) -> str:
    """The reason in a TensorFlow exception's text, in one line (errors.one_line); for a tf.function
    trace ("in user code: … File … Error: reason") its last line, where the reason is, not the heading."""
    lines = [line for line in str(e).splitlines() if line.strip()]
    traced = len(lines) > 1 and lines[0].strip().startswith("in user code")
    return one_line(lines[-1], 300) if traced else one_line(e, 300)


@contextlib.contextmanager
def stdout_to_stderr():
    """Send Python- and C-level writes to stdout onto stderr while TensorFlow works."""
    sys.stdout.flush()
    saved = None
    try:
        saved = os.dup(1)
        os.dup2(2, 1)
    except OSError:
        saved = None
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stdout.flush()
        if saved is not None:
            os.dup2(saved, 1)
            os.close(saved)


def import_tf(purpose: str = "TensorFlow sources"):
    """TensorFlow, imported quietly (exit 5 with the install hint when it is missing)."""

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    with stdout_to_stderr():
        tf = require("tensorflow", purpose=purpose)
    tf.get_logger().setLevel(logging.ERROR)
    try:
        from absl import logging as absl_logging

        absl_logging.set_verbosity(absl_logging.ERROR)
    except ImportError:
        pass
    return tf
