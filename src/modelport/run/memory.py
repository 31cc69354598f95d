"""Memory: the peak RSS of this process and its children while a stage runs, and the memory free
for a run that is about to start.

`window()` opens a measurement: a background thread sums the RSS of the process and all its
children (validation runs runtimes in child processes) every `INTERVAL` seconds while any window is
open, and each window keeps the largest sum seen. A spike of this process shorter than the interval
is still counted: the process's high-water mark (`own_peak`) is a lower bound of the peak whenever
it rose inside the window. The children's mark (RUSAGE_CHILDREN) is not one: on Linux a child started
by fork or vfork and exec inherits its parent's high-water mark (a `true` started by a process that
once held 1.6 GB reports 1.6 GB), so it is read only without psutil, as the one figure there is.

`available()` is what the kernel could give a new allocation without swapping
(psutil.virtual_memory().available, /proc/meminfo's MemAvailable without psutil), or
MODELPORT_AVAILABLE_MEMORY (bytes, or with a K/M/G/T suffix) when set.
"""

from __future__ import annotations

import functools
import os
import re
import threading
import time

from modelport.errors import BadInputError

INTERVAL = 0.1  # seconds between samples of the process tree
AVAILABLE_ENV = "MODELPORT_AVAILABLE_MEMORY"


def tree_rss() -> int | None:
    """The RSS of this process and all its descendants, in bytes (None without psutil)."""
    try:
        import psutil
    except ImportError:
        return None
    try:
        me = psutil.Process()
        procs = [me, *me.children(recursive=True)]
    except psutil.Error:
        return None
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:  # ended between listing and reading
            pass
    return total


def own_peak() -> int:
    """The largest RSS this process has had since it started its program, in bytes (0 where unknown).

    Linux's VmHWM (/proc/self/status) belongs to the process's address space, which exec replaces:
    it starts at the new program's size. `getrusage(RUSAGE_SELF).ru_maxrss` does not: a process
    started by fork/vfork and exec keeps the mark its parent had (a `python -c pass` started by a
    2 GB process reports 1.9 GB), so it is read only where /proc is not."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return _high_water()[0]


def _high_water() -> tuple[int, int]:
    """(getrusage's largest RSS of this process, and of a child that ended), bytes; (0, 0) off Unix."""
    try:
        import resource
    except ImportError:
        return 0, 0
    scale = 1 if os.uname().sysname == "Darwin" else 1024  # bytes on macOS, KiB on Linux
    return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale,
            resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * scale)


def _marks() -> tuple[int, int]:
    """(this process's high-water mark, the ended children's), bytes."""
    return own_peak(), _high_water()[1]


class Window:
    """The peak of one measurement (see `window`)."""

    def __init__(self):
        self.sampled = 0
        self._marks = _marks()
        self.closed = False
        self._peak: int | None = None

    def see(self, rss: int) -> None:
        self.sampled = max(self.sampled, rss)

    def close(self) -> int:
        """Stop measuring; returns the peak in bytes."""
        if self._peak is None:
            _sampler.remove(self)
            rss = tree_rss()
            if rss is not None:
                self.see(rss)
            peak = self.sampled
            marks = list(zip(self._marks, _marks(), strict=True))
            for before, after in marks if rss is None else marks[:1]:  # the children's mark: see the module docstring
                if after > before:  # the high-water mark rose inside the window: it was reached here
                    peak = max(peak, after)
            self._peak = peak
            self.closed = True
        return self._peak

    @property
    def peak(self) -> int:
        """The peak so far (the final one once closed)."""
        return self._peak if self._peak is not None else self.sampled


class _Sampler:
    """One thread for all open windows; it ends when the last window closes."""

    def __init__(self):
        self._lock = threading.Lock()
        self._windows: list[Window] = []
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()

    def add(self, w: Window) -> None:
        rss = tree_rss()
        if rss is None:
            return
        w.see(rss)
        with self._lock:
            self._windows.append(w)
            if self._thread is None or not self._thread.is_alive():
                self._wake.clear()
                self._thread = threading.Thread(target=self._run, name="modelport-memory", daemon=True)
                self._thread.start()

    def remove(self, w: Window) -> None:
        with self._lock:
            if w in self._windows:
                self._windows.remove(w)
            if not self._windows:
                self._wake.set()

    def _run(self) -> None:
        while True:
            with self._lock:
                windows = list(self._windows)
                if not windows:
                    self._thread = None
                    return
            rss = tree_rss()
            if rss is not None:
                for w in windows:
                    w.see(rss)
            if self._wake.wait(INTERVAL):
                self._wake.clear()


_sampler = _Sampler()


def window() -> Window:
    """Start measuring the process tree's peak RSS; `close()` ends it and returns the peak."""
    w = Window()
    _sampler.add(w)
    return w


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """'12G', '512 MiB', '1.5T', '1048576' -> bytes (powers of 1024)."""
    m = _SIZE.match(text)
    if not m:
        raise ValueError(f"not a size: {text!r} (bytes, or a number with K, M, G or T)")
    return int(float(m[1]) * 1024 ** " KMGT".index((m[2] or " ").upper()))


def available() -> int | None:
    """Bytes of memory a new allocation can get without swapping (MODELPORT_AVAILABLE_MEMORY
    overrides; None when it cannot be read)."""
    given = os.environ.get(AVAILABLE_ENV)
    if given:

        try:
            return parse_size(given)
        except ValueError as e:
            raise BadInputError(f"{AVAILABLE_ENV}: {e}") from None
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        pass
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def refuse_if_short(need: int, free: int | None, *, why: str, path) -> None:
    """A run estimated to need `need` bytes at its peak, with `free` available (None: unknown), is
    refused before any work (exit 2, naming both and `why`) rather than killed part way."""
    if free is not None and need > free:

        raise BadInputError(f"converting needs about {fmt_bytes(need)} of memory ({why}) and {fmt_bytes(free)} is available",
                            path=path, hint=f"free memory, or set {AVAILABLE_ENV}=<bytes> to run anyway, at the risk of being killed")


def fmt_bytes(n: int | float) -> str:
    """1.2 GB, 830 MB (decimal units, as the figures of docs/benchmarks.md)."""
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


def wait_idle(seconds: float = 1.0) -> None:
    """Let the sampler thread end (tests)."""
    end = time.monotonic() + seconds
    while _sampler._thread is not None and time.monotonic() < end:
        time.sleep(0.01)


def give_back() -> bool:
    """Hand the memory this process has freed back to the system (glibc's `malloc_trim`): the
    allocator keeps freed blocks for reuse, so a model dropped after its export still counts in the
    process's resident memory, beside everything that comes after. True when it ran (glibc only)."""
    import gc

    gc.collect()
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


@functools.cache
def _malloc_trim():
    """glibc's malloc_trim from the symbols already loaded (no library search: ctypes.util.find_library
    starts a child process), or None."""
    import ctypes

    try:
        return getattr(ctypes.CDLL(None), "malloc_trim", None)
    except OSError:
        return None
