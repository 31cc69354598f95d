"""Lazy imports of optional frameworks, turning an ImportError into a clear install hint."""

from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType

from modelport.errors import MissingDependencyError

# module name -> extra that installs it (the targets' own modules are in their descriptors'
# `extras`, modelport.targets; `extra_of` reads both)
EXTRAS = {
    "torch": "torch",
    "safetensors": "torch",
    "transformers": "torch",
    "tensorflow": "tf",
    "tf2onnx": "tf",
    "keras": "tf",
    "tf_keras": "tf",
    "tritonclient": "serve",
    "uvicorn": "serve",
    "grpc": "serve",
    "orjson": "serve",
    "kserve": "serve",  # installed without its dependencies: the Makefile's set-up says how
    "boto3": "serve",
    "onnxsim": "optimize",
    "onnxscript": "optimize",
    "onnx_ir": "optimize",
    "PIL": "optimize",
    "onnxconverter_common": "optimize",
    "cv2": "opencv",
}


# packages installed without their dependencies, beside the extras (the Makefile's set-up): their own
# pins conflict with the rest (paddlepaddle 3.3.1 pins opt_einsum==3.3.0, paddle2onnx 2.1.0 onnx<=1.17);
# everything else they import is in the base install. Module -> the install line a user runs.
NO_DEPS_INSTALLS = {"paddle": "pip install --no-deps paddlepaddle==3.3.1 paddle2onnx==2.1.0",
                    "paddle2onnx": "pip install --no-deps paddlepaddle==3.3.1 paddle2onnx==2.1.0"}


def extra_of(module: str) -> str | None:
    """The pip extra that installs top-level `module`: EXTRAS, else a target descriptor's `extras`."""
    if module in EXTRAS:
        return EXTRAS[module]
    from modelport.targets import TARGETS

    return next((t.extras[module] for t in TARGETS.values() if module in t.extras), None)


# modules whose import loads TensorFlow's C++ runtime (and its log lines)
TF_FAMILY = {"tensorflow", "keras", "tf_keras", "tf2onnx", "onnx2tf", "ai_edge_litert", "tflite_runtime"}

# Set before TensorFlow is imported: its C++ runtime reads them once. TF_CPP_MIN_LOG_LEVEL hides
# TF's own log lines; the oneDNN notice ("oneDNN custom operations are on…") is printed through
# absl before logging is configured and only TF_ENABLE_ONEDNN_OPTS=0 stops it (oneDNN's reordered
# kernels then stay off, so TensorFlow references are the plain, reproducible ones).
QUIET_ENV = {"TF_CPP_MIN_LOG_LEVEL": "3", "TF_ENABLE_ONEDNN_OPTS": "0", "GRPC_VERBOSITY": "ERROR", "GLOG_minloglevel": "3"}


# what QUIET_ENV sets that changes numbers, not only log output: a validation child takes it back
# unless the user set it (`runtime_defaults_env`)
NUMERIC_ENV = ("TF_ENABLE_ONEDNN_OPTS",)
_SET_HERE: set[str] = set()  # QUIET_ENV keys this process set itself

# loggers that report, at WARNING level on every import, what a CPU machine lacks: executorch imports
# torchao, which logs each CUDA kernel library it cannot load and the missing triton, and torch's pytree
# registry logs a deprecation of torchao's own registration
QUIET_LOGGERS = {"executorch": ("torchao", "torch.utils._pytree"), "torchao": ("torchao", "torch.utils._pytree")}


def runtime_defaults_env(env: dict[str, str]) -> dict[str, str]:
    """`env` as a runtime's user has it: without the numeric settings modelport made for its own
    quiet, and without `TF_USE_LEGACY_KERAS` (which makes TensorFlow reach for tf_keras)."""
    out = {k: v for k, v in env.items() if not (k in NUMERIC_ENV and (k in _SET_HERE or k not in os.environ))}
    out.pop("TF_USE_LEGACY_KERAS", None)
    return out


def quiet_framework_logs() -> None:
    """Silence framework log chatter in this process and the children it starts.

    Values the user set are kept; `MODELPORT_DEBUG=1` leaves everything as it is. Python-side
    loggers are quietened too when the frameworks are already imported.
    """
    if os.environ.get("MODELPORT_DEBUG"):
        return
    for key, value in QUIET_ENV.items():
        if not os.environ.get(key):
            os.environ[key] = value
            _SET_HERE.add(key)
    import logging

    for name in ("tensorflow", "absl", "tf2onnx", "onnx2tf", "keras", "h5py"):
        logging.getLogger(name).setLevel(logging.ERROR)
    if "absl.logging" in sys.modules:
        sys.modules["absl.logging"].set_verbosity("error")


def require(module: str, *, purpose: str | None = None) -> ModuleType:
    """Import `module` or raise MissingDependencyError naming the extra to install.

    Every lazy import of an optional framework goes through here, or through `missing_dependency`
    where a library imports it on its own; either way the user sees exit 5 and the extra.
    """
    top = module.split(".")[0]
    if top in TF_FAMILY and "tensorflow" not in sys.modules:
        quiet_framework_logs()
    if top in QUIET_LOGGERS and top not in sys.modules and not os.environ.get("MODELPORT_DEBUG"):
        import logging

        for name in QUIET_LOGGERS[top]:
            logging.getLogger(name).setLevel(logging.ERROR)
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise _missing(top, e, purpose) from e


def _missing(top: str, error: ImportError, purpose: str | None) -> MissingDependencyError:
    # the module that is really absent may be a dependency of the one asked for (onnxsim needs torch)
    absent = (getattr(error, "name", None) or top).split(".")[0]
    if extra_of(absent) is None:
        absent = top
    extra = extra_of(absent)
    what = f" for {purpose}" if purpose else ""
    needed_by = f" (needed by {top})" if absent != top else ""
    hint = NO_DEPS_INSTALLS.get(absent) or (f'pip install "modelport[{extra}]"' if extra else f"pip install {absent}")
    return MissingDependencyError(f"'{absent}' is not installed{needed_by}{what}: {error}", hint=hint)


def missing_dependency(exc: BaseException | None) -> MissingDependencyError | None:
    """The MissingDependencyError behind `exc`, when it (or an exception it was raised from)
    is the import of an optional framework failing; else None.

    Libraries import frameworks on their own and callers wrap what they raise, so the cause
    chain is searched: a "truncated or not a model" error caused by a missing `safetensors`
    is a missing dependency, not a bad file.
    """
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, MissingDependencyError):
            return exc
        if isinstance(exc, ImportError):
            name = (getattr(exc, "name", None) or "").split(".")[0]
            if extra_of(name) is not None:
                return _missing(name, exc, None)
        exc = exc.__cause__  # only explicit `raise ... from`: a fallback's except block is no cause
    return None


def version_of(module: str) -> str | None:
    """The installed version of a distribution, without importing it."""
    from importlib import metadata

    names = {"ai_edge_litert": "ai-edge-litert", "tensorflow": "tensorflow-cpu"}
    for name in (module, names.get(module, module), module.replace("_", "-")):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    if module == "tensorflow":
        try:
            return metadata.version("tensorflow")
        except metadata.PackageNotFoundError:
            return None
    return None


def target_modules() -> list[str]:
    """The top-level modules every target's descriptor names: its runtime's and those it needs."""
    from modelport.targets import TARGETS

    out: list[str] = []
    for t in TARGETS.values():
        for module in (*(t.needs or ()), *([t.runtime] if t.runtime else [])):
            if ":" not in module and module not in out:
                out.append(module)
    return out


def target_distributions() -> list[str]:
    """The installed distributions that provide `target_modules()` (their versions matter to a run)."""
    from importlib import metadata

    by_module = metadata.packages_distributions()
    return list(dict.fromkeys(d for m in target_modules() for d in by_module.get(m, [])))
