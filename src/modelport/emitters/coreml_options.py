"""The Core ML target's own options (Python API; no flag yet).

Kept apart from the emitter so the command line can read them without loading coremltools.
"""

from __future__ import annotations

from dataclasses import dataclass

from modelport.errors import BadInputError
from modelport.targets import TargetOptions, option

DEPLOYMENT_TARGETS = ("iOS15", "iOS16", "iOS17", "iOS18", "macOS12", "macOS13", "macOS14", "macOS15")


@dataclass(frozen=True)
class CoreMLOptions(TargetOptions):
    """The Core ML emitter's own options: `deployment_target`, the oldest OS the package must load
    on (coremltools' `minimum_deployment_target`; ML Programs need iOS15/macOS12 or later)."""

    deployment_target: str = option("iOS16")

    def __post_init__(self):

        known = {t.lower(): t for t in DEPLOYMENT_TARGETS}
        if str(self.deployment_target).lower() not in known:
            raise BadInputError(f"unknown Core ML deployment target '{self.deployment_target}'; known: {', '.join(DEPLOYMENT_TARGETS)}")
        object.__setattr__(self, "deployment_target", known[str(self.deployment_target).lower()])
