"""Fault injection for child processes: make one function of one module kill its process.

A `sitecustomize.py` on the child's PYTHONPATH wraps `module.function` so that calling it sends
the given signal to the calling process. Only processes started after `inject_crash` see it; the
test process itself is unaffected, so a test that expects the crash proves the work ran in a child.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV = "MODELPORT_TEST_CRASH"

SITECUSTOMIZE = '''
import importlib.abc
import os
import signal
import sys

_spec = os.environ.get("MODELPORT_TEST_CRASH")
if _spec:
    _module, _function, _signal = _spec.split(":")

    def _crash(*args, **kwargs):
        os.kill(os.getpid(), getattr(signal, _signal))

    class _Hook(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name != _module:
                return None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(name, path, target)
                if spec is not None and spec.loader is not None:
                    exec_module = spec.loader.exec_module

                    def patched(module, exec_module=exec_module):
                        exec_module(module)
                        setattr(module, _function, _crash)

                    spec.loader.exec_module = patched
                    return spec
            return None

    sys.meta_path.insert(0, _Hook())
'''


def inject_crash(monkeypatch, folder: Path, target: str, signal_name: str) -> None:
    """Children started from now on die with `signal_name` when they call `target` ('module:function')."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(SITECUSTOMIZE)
    module, function = target.split(":")
    monkeypatch.setenv(ENV, f"{module}:{function}:{signal_name}")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH")) if p))
