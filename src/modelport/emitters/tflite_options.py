"""The TFLite target's own options and their flags (`--tflite-layout`, `--tflite-io-dtype`).

Kept apart from the emitter, which imports numpy and TensorFlow's tooling, so the command line
can declare the flags without loading either.
"""

from __future__ import annotations

from dataclasses import dataclass

from modelport.errors import BadInputError
from modelport.targets import TargetOptions, option

LAYOUTS = ("source", "nhwc")  # the contract's layouts, or channels-last inputs and outputs
IO_DTYPES = ("float32", "int8", "uint8")  # the I/O type of a full-integer model


@dataclass(frozen=True)
class TFLiteOptions(TargetOptions):
    """The TFLite emitter's own options, validated here and nowhere else."""

    layout: str = option("source", flag="--tflite-layout", metavar="LAYOUT", help=f"TFLite I/O layout: {' or '.join(LAYOUTS)} "
                                                                "(the contract's, or channels-last inputs and outputs).")
    io_dtype: str = option("float32", flag="--tflite-io-dtype", metavar="DTYPE", help="Full-integer TFLite (--precision int8 --calibration) "
                                                                     f"I/O type: {', '.join(IO_DTYPES)}.")

    def __post_init__(self):
        layout, io_dtype = str(self.layout).strip().lower(), str(self.io_dtype).strip().lower()
        if layout not in LAYOUTS:
            raise BadInputError(f"unknown --tflite-layout '{self.layout}'; known: {', '.join(LAYOUTS)}")
        if io_dtype not in IO_DTYPES:
            raise BadInputError(f"unknown --tflite-io-dtype '{self.io_dtype}'; known: {', '.join(IO_DTYPES)}")
        object.__setattr__(self, "layout", layout)
        object.__setattr__(self, "io_dtype", io_dtype)
