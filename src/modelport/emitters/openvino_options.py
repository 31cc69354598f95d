"""The OpenVINO target's own options (Python API and `--optimize auto`; no flag yet).

Kept apart from the emitter so the command line can read them without loading OpenVINO.
"""

from __future__ import annotations

from dataclasses import dataclass

from modelport.registry import choice
from modelport.targets import TargetOptions, option

INT8_MODES = ("static", "weights")


@dataclass(frozen=True)
class OpenVINOOptions(TargetOptions):
    """The OpenVINO emitter's own options.

    `int8_mode`: `static` (NNCF quantisation, needs calibration data) or `weights` (INT8 weights
    only, data-free); default: static when calibration data is given. `budget`: the accuracy budget
    that turns static quantisation into `quantize_with_accuracy_control`; the run's
    `--accuracy-budget` when not given.
    """

    int8_mode: str | None = option(None)
    budget: object = option(None, run="budget")  # validation.Tolerance

    def __post_init__(self):

        object.__setattr__(self, "int8_mode", choice(self.int8_mode, INT8_MODES, "OpenVINO INT8 mode"))
