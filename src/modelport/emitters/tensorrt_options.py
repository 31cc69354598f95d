"""The TensorRT target's own options and their flags (`--plan-only`, `--trt-shapes`, `--workspace`).

Kept apart from the emitter so the command line can declare the flags without loading it.
"""

from __future__ import annotations

from dataclasses import dataclass

from modelport.errors import BadInputError
from modelport.targets import TargetOptions, option


@dataclass(frozen=True)
class TensorRTOptions(TargetOptions):
    """The TensorRT emitter's own options, validated here and nowhere else."""

    plan_only: bool = option(False, flag="--plan-only", help="TensorRT: check and write the build plan (tensorrt/) "
                                                             "without building an engine.")
    shapes: tuple[str, ...] = option((), flag="--trt-shapes", metavar="NAME:MIN:OPT:MAX", help="TensorRT profile of an input: its min, opt and max "
                                                                   "shapes, e.g. ids:1x16:8x128:32x512 (repeatable).")
    workspace: int | None = option(None, flag="--workspace", metavar="MiB", help="TensorRT builder workspace limit in MiB (default 4096).")

    def __post_init__(self):
        from modelport.emitters.trt_plan import parse_shapes_option

        shapes = (self.shapes,) if isinstance(self.shapes, str) else tuple(self.shapes or ())
        parse_shapes_option(list(shapes))  # syntax errors before any work
        object.__setattr__(self, "shapes", shapes)
        if self.workspace is not None and self.workspace < 1:
            raise BadInputError("--workspace must be a positive number of MiB")
