"""Bounds on a stage's time and memory, so a stage that runs away fails naming itself.

An export that loops for fifteen minutes at 16 GB before the system kills it tells the user
nothing. Every stage of a conversion runs `bounded`: a watcher thread samples how much the
process tree's resident memory (this process and its children: validation runs runtimes in child
processes) grew since the stage began, and the stage's elapsed time, every POLL_S seconds; past
either bound it interrupts the stage, which
then fails with a StageLimitError (exit 2, as a run that cannot fit the memory it is given)
naming the stage, the time it ran and the memory it held, and the flag that raises the bound.
Python code is interrupted at once; a library busy in native code for longer than GRACE_S after
that is stopped hard: its child processes are killed, the staging folders of the run are removed,
and the process exits 2 with the same one line.

The bounds: `--stage-timeout SECONDS` (MODELPORT_STAGE_TIMEOUT; default DEFAULT_SECONDS) and
`--stage-memory SIZE`, what a stage may take beyond what the run held when it began
(MODELPORT_STAGE_MEMORY). By default the memory bound comes from the machine, not from a guess
about the model: what it has available when the stage begins (`memory.available()`, which
MODELPORT_AVAILABLE_MEMORY overrides), less MEMORY_MARGIN for the kernel and the user's other
programs. Past that, the kernel's OOM killer would end the run without a word; the bound ends it
first, with one line. A guess from the model's size refused right conversions: a Keras ResNet50
(100 MB of weights) takes 6.5 GB more memory in its parse, TensorFlow's arenas and tf2onnx's graph
copies, where 8x the weights gave 6 GB. Only a stage run from the main thread is watched (a thread
cannot be interrupted there; batch runs bound each job's process).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from dataclasses import dataclass

from modelport.errors import BadInputError
from modelport.run import memory as mem
from modelport.run.memory import available, fmt_bytes, tree_rss
from modelport.run.staging import OPEN_STAGES

DEFAULT_SECONDS = 3600.0
MEMORY_MARGIN = 1 << 30  # left to the kernel (page tables, the page cache it needs) and the user's other programs
POLL_S = 0.5
GRACE_S = 60.0
TIME_ENV = "MODELPORT_STAGE_TIMEOUT"
MEMORY_ENV = "MODELPORT_STAGE_MEMORY"


class StageLimitError(BadInputError):
    """A stage ran past its time or memory bound (exit 2: the run does not fit what it is given)."""


@dataclass(frozen=True)
class Limits:
    """The bounds one stage runs under: seconds, and bytes of the process tree's resident memory
    beyond what it held when the stage began; `memory` None: what the machine has available then,
    less MEMORY_MARGIN (`memory_at_start`)."""

    seconds: float | None
    memory: int | None = None

    @classmethod
    def of(cls, seconds: float | str | None = None, memory: int | str | None = None) -> Limits:
        """The bounds asked for (flags, else the environment), else the defaults: DEFAULT_SECONDS,
        and memory from the machine at each stage's start."""
        seconds = seconds if seconds is not None else os.environ.get(TIME_ENV)
        memory = memory if memory is not None else os.environ.get(MEMORY_ENV)
        try:
            seconds = float(seconds) if seconds is not None else DEFAULT_SECONDS
        except ValueError:
            raise BadInputError(f"bad --stage-timeout {seconds!r}: a number of seconds") from None
        if seconds <= 0:
            raise BadInputError(f"bad --stage-timeout {seconds:g}: more than 0 seconds")
        if isinstance(memory, str):
            try:
                memory = mem.parse_size(memory)
            except ValueError:
                raise BadInputError(f"bad --stage-memory {memory!r}: a size such as 8G or 512M") from None
        return cls(seconds, None if memory is None else int(memory))

    def memory_at_start(self) -> tuple[int | None, str]:
        """(the memory bound of a stage beginning now, what it is): the one asked for, else what the
        machine has available less MEMORY_MARGIN (None: unknown, unbounded)."""

        if self.memory is not None:
            return self.memory, f"its bound of {fmt_bytes(self.memory)}"
        free = available()
        if free is None:
            return None, ""
        bound = max(0, free - MEMORY_MARGIN)
        return bound, (f"the {fmt_bytes(bound)} the machine could give when the stage began ({fmt_bytes(free)} "
                       f"available, less a margin of {fmt_bytes(MEMORY_MARGIN)})")

    def flags(self) -> str:
        return f"--stage-timeout {self.seconds:g}" + (f" --stage-memory {self.memory}" if self.memory is not None else "")


@contextlib.contextmanager
def bounded(stage: str, limits: Limits | None):
    """Run the block as stage `stage` under `limits` (None: unbounded); see the module docstring."""
    if limits is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    import signal

    # the watcher interrupts the stage as SIGINT would: with another handler installed (a server
    # library's, a previous run's in the same process) no KeyboardInterrupt would come, and the
    # stage would be stopped hard; Python's own handler is put back for the stage's length
    handler = signal.getsignal(signal.SIGINT)
    if handler is not signal.default_int_handler:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    watch = _Watch(stage, limits)
    watch.start()
    try:
        yield
    except KeyboardInterrupt:
        if watch.breach is None:
            raise
        raise StageLimitError(watch.breach, hint=watch.hint) from None
    finally:
        watch.stop()
        if handler is not signal.default_int_handler and handler is not None:
            signal.signal(signal.SIGINT, handler)


class _Watch(threading.Thread):
    def __init__(self, stage: str, limits: Limits):
        super().__init__(name=f"modelport-limits-{stage}", daemon=True)
        self.stage, self.limits = stage, limits
        self.breach: str | None = None
        self.hint = ""
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._inside = True

    def stop(self) -> None:
        with self._lock:
            self._inside = False
        self._done.set()

    def run(self) -> None:

        start, base = time.monotonic(), tree_rss() or 0
        bound, what_bound = self.limits.memory_at_start()
        while not self._done.wait(POLL_S):
            elapsed, held = time.monotonic() - start, (tree_rss() or 0) - base
            over_time = self.limits.seconds is not None and elapsed > self.limits.seconds
            over_memory = bound is not None and held > bound
            if not (over_time or over_memory):
                continue
            what = (f"ran {elapsed:.0f} s, past its bound of {self.limits.seconds:g} s" if over_time else
                    f"took {fmt_bytes(held)} more memory (this process and its children), past {what_bound}")
            self.breach = f"stage '{self.stage}' {what}; stopped"
            self.hint = ("raise the bound with --stage-timeout SECONDS (or MODELPORT_STAGE_TIMEOUT)" if over_time else
                         "raise the bound with --stage-memory SIZE (or MODELPORT_STAGE_MEMORY), e.g. --stage-memory 32G"
                         if self.limits.memory is not None else
                         "free memory for it, or bound the stage yourself with --stage-memory SIZE (the kernel may "
                         "then end the run instead)")
            with self._lock:
                if not self._inside:
                    return
                import _thread

                _thread.interrupt_main()
            if not self._done.wait(GRACE_S):
                _stop_hard(f"{self.breach} ({self.hint})")
            return


def _stop_hard(line: str) -> None:
    """The stage did not answer the interrupt (a library in native code): its children killed, the run's
    staging folders removed, one line on stderr, exit 2."""
    import shutil


    try:
        import psutil

        for child in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                child.kill()
    except ImportError:
        pass
    for folder in list(OPEN_STAGES):
        shutil.rmtree(folder, ignore_errors=True)
    sys.stderr.write(f"error: {line}\n")
    sys.stderr.flush()
    os._exit(BadInputError.exit_code)
