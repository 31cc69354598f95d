"""The ExecuTorch target's own options and their flag (`--executorch-backend`).

Kept apart from the emitter so the command line can declare the flag without loading it.
"""

from __future__ import annotations

from dataclasses import dataclass

from modelport.registry import choice
from modelport.targets import TargetOptions, option

BACKENDS = ("xnnpack", "portable")


@dataclass(frozen=True)
class ExecuTorchOptions(TargetOptions):
    """The ExecuTorch emitter's own options. `backend`: `xnnpack` (delegate to XNNPACK where it
    takes the ops, the rest on the portable kernels) or `portable` (no delegate)."""

    backend: str = option("xnnpack", flag="--executorch-backend", metavar="BACKEND", help=f"ExecuTorch delegate: {' or '.join(BACKENDS)} "
                                                                       "(XNNPACK where it takes the ops, or the portable kernels alone).")

    def __post_init__(self):

        object.__setattr__(self, "backend", choice(self.backend or "xnnpack", BACKENDS, "ExecuTorch backend"))
