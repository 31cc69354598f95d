"""The IR at the precision a target asks for, through the project's precision passes."""

from __future__ import annotations

from modelport.errors import BadInputError, MissingDependencyError, ModelportError, ValidationError, one_line
from modelport.ir import IRModel
from modelport.optimize import quantize
from modelport.optimize.calibration import load_calibration
from modelport.optimize.precision import to_fp16


def at_precision(ir: IRModel, precision: str, *, calibration=None) -> IRModel:
    """fp32: as is; fp16: FP16 weights and activations with FP32 I/O; int8: dynamic INT8
    quantization, or static (QDQ) when `calibration` (an .npz or image folder) is given.
    An IR already at that precision (an --optimize stage ran) is returned unchanged."""
    if precision == "fp32" or ir.provenance.get("precision") == precision:
        return ir
    if precision == "fp16":

        return _delivered("fp16", lambda: to_fp16(ir, keep_io_types=True))
    if precision == "int8":

        if calibration:

            data = load_calibration(calibration, ir)
            return _delivered("int8", lambda: quantize.quantize_static(ir, data))
        return _delivered("int8", lambda: quantize.quantize_dynamic(ir))
    raise BadInputError(f"unknown precision '{precision}'; known: fp32, fp16, int8")


def _delivered(precision: str, convert) -> IRModel:
    """A converter that fails on the model (the quantiser's "Expected … to be an initializer", an
    FP16 graph onnxruntime rejects) means the precision cannot be delivered: a validation failure
    (exit 4) that a precision fallback may accept, as the same failure of an optimisation pass is."""

    try:
        return convert()
    except MissingDependencyError:
        raise
    except BadInputError as e:
        raise ValidationError(f"--precision {precision} cannot be delivered: {e.message}") from e
    except ModelportError:
        raise
    except Exception as e:
        raise ValidationError(f"--precision {precision} cannot be delivered: {one_line(e, typed=True)}") from e
