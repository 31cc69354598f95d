"""What an emitter wrote: one artifact, with how to run it and, where it cannot be run here, why.

It sits in the base layer so that the stages above (emitters, which make it) and below
(`validation/artifact.py`, which validates it) share one definition.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


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
    # what the emitter chose for the user that they should hear of (a kernel kept out of a delegate);
    # the pipeline warns with them once the artifact has passed its validation
    warnings: list[str] = field(default_factory=list)

    def to_dict(self, root: Path | None = None) -> dict[str, Any]:
        from modelport.run.staging import describe_files  # shutil, tempfile: not at CLI start-up

        return {"target": self.target, "runtime": self.runtime, "precision": self.precision,
                **describe_files(self.path, self.files, root), **self.details}
