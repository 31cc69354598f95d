"""Emitters turn an IRModel into a target runtime's artifact. A registry keyed by the --to name.

Each emitter module has `NAME`, `RUNTIME`, `DESCRIPTION`,
`preflight(model: IRModel, options: EmitOptions) -> Preflight` (what the target cannot represent;
`emitters/preflight.py`) and `emit(model: IRModel, out_dir: Path, options: EmitOptions) -> Artifact`;
its own options class (frozen, self-validating, declaring its CLI flags) sits in a small module of
its own (`<target>_options.py`), named by its descriptor's `options`. The pipeline gives each
emitter the IR at the precision it is to write (modelport.resolve.precisions: the optimisation stage
applies it, or the emitter's own converter does), runs every target's preflight first, then
validates each artifact through `runtimes/` against the IR's reference outputs. Adding a target is its own module(s) plus one descriptor in
`modelport/targets.py` (TARGETS), from which EMITTERS and every other table is derived;
docs/adding_a_target.md lists the fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

from modelport.artifact import Artifact
from modelport.registry import EMITTERS
from modelport.targets import TargetOptions

__all__ = ["Artifact", "EmitOptions", "get_emitter", "register_emitter"]

register_emitter = EMITTERS.register


@dataclass(frozen=True)
class EmitOptions:
    """What every emitter reads. `precision`: the precision its artifact is made at (modelport.resolve.precisions);
    `target`: the emitter's own options (an instance of its descriptor's `options` class, e.g.
    TFLiteOptions; ConvertOptions.target_options), or None for that class's defaults."""

    precision: str = "fp32"
    opset: int | None = None
    calibration: str | None = None  # INT8 calibration data: .npz of named inputs or a folder of images
    target: TargetOptions | None = None


def get_emitter(name: str) -> ModuleType:
    return EMITTERS.load(name)
