"""Runners: every runtime exposes `run(feeds: dict[str, ndarray]) -> dict[str, ndarray]` and
`input_specs() -> list[TensorSpec]` (what to feed it; dynamic dims symbolic), and declares the
optional abilities it has (`runtimes/base.py`: Runner, Capabilities).

Parity checks, `validate` and benchmarks all go through this one interface. Runners are looked
up by name and imported lazily, so a missing runtime costs nothing until it is asked for (a
runner's module imports its runtime only when a runner is made).
"""

from __future__ import annotations

from modelport.errors import BadInputError
from modelport.registry import Registry
from modelport.runtimes.base import Runner
from modelport.targets import TARGETS, on_register

# runtime name -> "module:factory"; the factory takes the model (object or path) and options. The
# runners of targets' artifacts come from their descriptors (`modelport.targets`: runtime, runner);
# `torch` runs PyTorch sources.
RUNNERS = Registry("runtime", {"onnxruntime": "modelport.runtimes.onnxruntime:OnnxRuntimeRunner",
                               "torch": "modelport.runtimes.torch:TorchRunner"})


def _add_runner(target) -> None:
    if target.runtime and target.runner:
        RUNNERS.register(target.runtime, target.runner)


def _remove_runner(target) -> None:
    if target.runtime and target.runner and not any(t.runtime == target.runtime and t.runner for t in TARGETS.values()) \
            and target.runtime not in ("onnxruntime", "torch"):
        RUNNERS.unregister(target.runtime)


for _target in TARGETS.values():
    _add_runner(_target)
on_register(_add_runner, _remove_runner)
register_runner = RUNNERS.register


def get_runner(name: str, model, **options) -> Runner:
    return RUNNERS.load(name)(model, **options)


def runner_class(name: str) -> type[Runner]:
    """The runner class registered for runtime `name` (its declared abilities, before anything is loaded)."""
    return RUNNERS.load(name)


# CPU runtime -> the targets whose artifacts it runs (the first is what it writes when it wins `--optimize auto`)
CPU_RUNTIMES: dict[str, tuple[str, ...]] = {"onnxruntime": ("onnx", "ort"), "openvino": ("openvino",)}


def installed_runtimes() -> list[str]:
    """The CPU runtimes importable here (onnxruntime is a core dependency)."""
    import importlib.util

    def importable(name: str) -> bool:
        try:
            return importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a module set to None in sys.modules (hidden) has no spec
            return False

    return [r for r in CPU_RUNTIMES if r == "onnxruntime" or importable(r)]


def default_runtimes(targets) -> tuple[str, ...]:
    """Every installed CPU runtime that writes one of `targets` (onnxruntime when none does)."""
    found = tuple(r for r in installed_runtimes() if any(t in CPU_RUNTIMES[r] for t in targets))
    return found or ("onnxruntime",)


def check_runtimes(names) -> tuple[str, ...] | None:
    """`--runtimes onnxruntime,openvino` as a tuple of known CPU runtimes (exit 2 naming the known ones)."""
    if names is None:
        return None
    items = names.split(",") if isinstance(names, str) else [p for n in names for p in str(n).split(",")]
    out = []
    for item in (i.strip().lower() for i in items):
        if not item:
            continue
        if item not in CPU_RUNTIMES:
            raise BadInputError(f"unknown runtime '{item}' for --runtimes; known: {', '.join(CPU_RUNTIMES)}")
        if item not in out:
            out.append(item)
    return tuple(out) or None
