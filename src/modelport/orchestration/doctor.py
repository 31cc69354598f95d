"""`doctor`: what this installation can do, read without importing the frameworks.

Versions come from package metadata (`importlib.metadata`); a package counts as usable when its
distribution is installed and its top-level module can be found (`importlib.util.find_spec`,
which imports nothing). The extras are those of the `pyproject.toml` beside the source tree when
modelport runs from one, else those of the installed distribution's metadata. Only onnxruntime is
imported (about 0.25 s), to list its execution providers.

Result fields: `modelport`, `python`, `platform`; `extras[]` {name, installed, missing[]};
`packages` {distribution: version or null}; `onnxruntime_providers`; `gpu` {nvidia_smi, gpus[],
runtimes {target: version of what it needs, or null} for the targets that need a GPU}; `cpu`
{model, cores, features {avx2, avx512, vnni, bf16, amx}}; `targets[]` and `sources[]` {name,
ready, missing[] (modules), install (the extras to add); a target whose runner cannot run its
artifacts here: runs_here false and the runner's reason as `note`}. What a target or source needs
comes from its descriptor (`modelport.targets`) or its parser's entry (`parsers.PARSER_NEEDS`).
"""

from __future__ import annotations

import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from modelport.deps import extra_of, target_distributions
from modelport.emitters import EMITTERS
from modelport.parsers import PARSER_NEEDS, PARSERS
from modelport.runtimes import runner_class
from modelport.targets import TARGETS, emitting
from modelport.version import __version__

# the converters and tools whose versions matter to a run (distribution names); every target's
# runtime and what it needs are added from the descriptors (`deps.target_distributions`)
PACKAGES = ("onnx", "onnxruntime", "onnxruntime-gpu", "onnxscript", "onnx-ir", "onnxsim", "onnxconverter-common", "torch",
            "safetensors", "transformers", "tensorflow", "tensorflow-cpu", "keras", "tf-keras", "tf2onnx", "onnx2tf",
            "litert-torch", "nncf", "polygraphy", "ray", "tritonclient", "torchserve", "torch-model-archiver")
# /proc/cpuinfo flags -> the feature a precision choice depends on
CPU_FEATURES = {"avx2": ("avx2",), "avx512": ("avx512f",), "vnni": ("avx512_vnni", "avx_vnni"),
                "bf16": ("avx512_bf16", "avx_ne_convert"), "amx": ("amx_tile", "amx_bf16", "amx_int8")}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _findable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _top_modules(dist: str) -> list[str]:
    try:
        text = metadata.distribution(dist).read_text("top_level.txt") or ""
    except metadata.PackageNotFoundError:
        return []
    return [m for m in text.split() if m and not m.startswith("_")] or [_norm(dist).replace("-", "_")]


def installed(requirement: str) -> bool:
    """Whether a requirement's distribution is installed and its module can be imported."""
    name = re.split(r"[\[<>=!~; ]", requirement.strip(), maxsplit=1)[0]
    if _version(name) is None:
        return False
    return all(_findable(m) for m in _top_modules(name)[:1])


def declared_extras() -> dict[str, list[str]]:
    """extra -> its requirements, from the source tree's pyproject.toml or the installed metadata."""
    pyproject = Path(__file__).resolve().parents[3] / "pyproject.toml"  # src/modelport/orchestration/doctor.py
    if pyproject.is_file():
        import tomllib

        try:
            project = tomllib.loads(pyproject.read_text()).get("project") or {}
        except (OSError, tomllib.TOMLDecodeError):
            project = {}
        if project.get("name") == "modelport":
            return {k: list(v) for k, v in (project.get("optional-dependencies") or {}).items()}
    extras: dict[str, list[str]] = {}
    try:
        dist = metadata.distribution("modelport")
    except metadata.PackageNotFoundError:
        return extras
    for name in dist.metadata.get_all("Provides-Extra") or []:
        extras[name] = []
    for req in dist.requires or []:
        m = re.search(r"""extra\s*==\s*["']([^"']+)["']""", req)
        if m:
            extras.setdefault(m.group(1), []).append(req.split(";")[0].strip())
    return extras


def target_needs() -> dict[str, list[str]]:
    """`--to` target -> the top-level modules it needs, from the targets' descriptors."""

    return {t.name: list(t.needs) for t in emitting() if t.needs is not None}


def _needs(table: dict[str, list[str]], names, *, gpu: bool = True) -> list[dict]:
    from modelport.targets import TARGETS, load

    gpu_targets = {t.name for t in TARGETS.values() if t.gpu}

    out = []
    for name in names:
        needs = table.get(name)
        if needs is None:
            out.append({"name": name, "ready": None, "missing": [], "install": []})
            continue
        missing = [m for m in needs if ":" not in m and not _findable(m)]
        extras = sorted({extra_of(m) or m for m in missing})
        for probe in (m for m in needs if ":" in m):  # "module:function": what is missing outside Python (and how to get it), or None
            absent = load(probe)()
            if absent:
                missing.append(absent)
        if name in gpu_targets and not gpu:
            missing.append("an NVIDIA GPU (or --plan-only)")
        entry = {"name": name, "ready": not missing, "missing": missing, "install": extras}
        elsewhere = _runs_elsewhere(TARGETS.get(name))
        if elsewhere:  # built here, run (and validated) only where its runtime is
            entry.update(runs_here=False, note=elsewhere)
        out.append(entry)
    return out


def _runs_elsewhere(target) -> str | None:
    """'… artifacts can be built here but not run: <the runner's reason>' for a target whose runner
    declares it cannot run here (runtimes/base.py: `cannot_run`), else None."""

    if target is None or not target.runner:
        return None
    reason = runner_class(target.runtime).cannot_run()
    if not reason:
        return None
    return f"{target.title or target.name} artifacts can be built here but not run: {reason} (validate them there)"


def cpu_info(cpuinfo: str | None = None) -> dict:
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    flags = set()
    model = None
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features") and not flags:
            flags = set(value.split())
        elif key.strip() == "model name" and model is None:
            model = value.strip()
    return {"model": model or platform.processor() or None, "cores": os.cpu_count(), "machine": platform.machine(),
            "features": {k: any(f in flags for f in names) for k, names in CPU_FEATURES.items()} if flags else {}}


def gpu_info() -> dict:
    smi = shutil.which("nvidia-smi")
    gpus = []
    if smi:
        try:
            out = subprocess.run([smi, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=10).stdout
            gpus = [dict(zip(("name", "driver", "memory"), (c.strip() for c in line.split(",")), strict=False))
                    for line in out.splitlines() if line.strip()]
        except (OSError, subprocess.TimeoutExpired):
            gpus = []

    runtimes = {t.name: next((_version(d) for d in metadata.packages_distributions().get(t.runtime, [])), None)
                if _findable(t.runtime) else None for t in TARGETS.values() if t.gpu}
    return {"nvidia_smi": smi, "gpus": gpus, "runtimes": runtimes}


def ort_providers() -> list[str] | None:
    if not _findable("onnxruntime"):
        return None
    try:
        import onnxruntime

        return list(onnxruntime.get_available_providers())
    except Exception:  # a broken install: doctor reports, it does not fail
        return None


def doctor() -> dict:

    extras = []
    for name, reqs in declared_extras().items():
        missing = [r for r in reqs if not installed(r)]
        extras.append({"name": name, "installed": not missing, "missing": missing})
    packages = {}
    for dist in dict.fromkeys((*PACKAGES, *target_distributions())):
        v = _version(dist)
        if v is not None:
            packages[dist] = v
    gpu = gpu_info()
    return {
        "modelport": __version__, "python": platform.python_version(), "executable": sys.executable,
        "platform": platform.platform(terse=True), "extras": extras, "packages": packages,
        "onnxruntime_providers": ort_providers(), "gpu": gpu, "cpu": cpu_info(),
        "targets": _needs(target_needs(), list(EMITTERS), gpu=bool(gpu["gpus"])), "sources": _needs(PARSER_NEEDS, list(PARSERS)),
    }
