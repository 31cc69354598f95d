"""Emitters turn an IRModel into a target runtime's artifact. A registry keyed by the --to name.

Each emitter module has `NAME`, `RUNTIME`, `DESCRIPTION`, optionally `OPTIONS` (the frozen,
self-validating class of its own options, the one its descriptor's `options` names),
`preflight(model: IRModel, options: EmitOptions) -> Preflight` (what the target cannot represent;
`emitters/preflight.py`) and `emit(model: IRModel, out_dir: Path, options: EmitOptions) -> Artifact`;
the pipeline runs every target's preflight first, then validates each artifact through `runtimes/`
against the IR's reference outputs. Adding a target is its own module(s) plus one descriptor in
`modelport/targets.py` (TARGETS), from which EMITTERS and every other table is derived;
docs/adding_a_target.md lists the fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from modelport.registry import EMITTERS

register_emitter = EMITTERS.register


@dataclass(frozen=True)
class EmitOptions:
    """What every emitter reads. `target` is the emitter's own options (an instance of its module's
    `OPTIONS` class, e.g. TFLiteOptions; ConvertOptions.target_options), or None for that class's defaults."""

    precision: str = "fp32"
    opset: int | None = None
    calibration: str | None = None  # INT8 calibration data: .npz of named inputs or a folder of images
    target: Any = None


@dataclass
class Artifact:
    """What an emitter wrote: the target, the runtime that runs it, its files and precision."""

    target: str
    runtime: str
    path: Path  # the main file (or folder)
    files: list[Path]
    precision: str = "fp32"
    details: dict[str, Any] = field(default_factory=dict)
    # how to run it: a runtimes/ name and options, or None when no runtime here can (e.g. no GPU)
    runner: str | None = None
    runner_options: dict[str, Any] = field(default_factory=dict)
    # why it cannot be validated here (Core ML off macOS, a TensorRT plan without an engine), or None.
    # The pipeline then checks what it can (with a runner: its I/O against the contract, from the
    # runner's input/output specs, nothing run), records `validated: false` with this reason, warns,
    # and fails the run under --strict (exit 4).
    not_validated: str | None = None
    # the data to validate it with when the emitter judged it on other data than the IR's
    # references (a model calibrated for INT8 is judged on its calibration data); None: the IR's
    reference: Any = None

    def to_dict(self, root: Path | None = None) -> dict[str, Any]:
        from modelport.staging import describe_files  # shutil, tempfile: not at CLI start-up

        return {"target": self.target, "runtime": self.runtime, "precision": self.precision,
                **describe_files(self.path, self.files, root), **self.details}


def get_emitter(name: str) -> ModuleType:
    return EMITTERS.load(name)
