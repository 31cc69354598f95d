"""The OpenVINO target: OpenVINO IR (`model.xml` + `model.bin`), validated in OpenVINO on CPU.

Route: the IR's ONNX model through OpenVINO's ONNX front end (`Core.read_model`, the front end
`openvino.convert_model` wraps, without its usage telemetry), then `openvino.save_model`. Every
source framework reaches OpenVINO through the same ONNX model, which the run has already checked
against the source; OpenVINO's own PyTorch and TensorFlow front ends would need the live source
object and example inputs, and give the same graph for the models here.

Precisions (the artifact's `precision`; the inference precision it was validated at is recorded
in `details.inference_precision` and in the IR's rt_info, as OpenVINO's `runtime_options`
INFERENCE_PRECISION_HINT, where modelport's runner reads it). OpenVINO 2026.4's CPU plugin does
not apply that entry, so a plain `compile_model` runs an fp32 IR in bf16 on a CPU with BF16: the
validation opens the IR that way too and reports the precision it ran at (`plain_compile`, with
its figures where it is not the validated one):

- `fp32`: FP32 weights, inference precision pinned to f32 (OpenVINO's CPU default on BF16
  hardware would be bf16).
- `fp16`: FP16 weights (`compress_to_fp16`), decompressed at load; inference in f16 where the
  CPU has native FP16, else f32.
- `bf16`: FP32 weights, inference precision bf16; refused with exit 5 on a CPU without BF16.
- `int8`: NNCF post-training quantisation on `--calibration` data (`nncf.quantize`; with
  `--accuracy-budget`, `nncf.quantize_with_accuracy_control`, which keeps the layers that cost
  the most accuracy in floating point); without calibration data, INT8 weights
  (`nncf.compress_weights`, data-free). Non-quantised ops run in f32.

Preflight converts the ONNX model with OpenVINO's ONNX front end partially and names every node
it could not convert (all of them, with counts).
"""

from __future__ import annotations

from pathlib import Path

from modelport.emitters import Artifact, EmitOptions
from modelport.emitters.norm_fallback import screened_ir
from modelport.emitters.openvino_options import OpenVINOOptions
from modelport.emitters.preflight import Preflight, node_name, opset_of
from modelport.errors import one_line
from modelport.ir import IRModel
from modelport.onnxfile.onnx_io import save_onnx
from modelport.optimize.calibration import load_calibration
from modelport.optimize.openvino_precision import build, save
from modelport.optimize.quantize import calibration_reference
from modelport.runtimes.openvino import require_openvino

NAME = "openvino"
RUNTIME = "openvino"
DESCRIPTION = "OpenVINO IR (model.xml + model.bin): fp32, fp16 weights, bf16 inference, INT8 (NNCF); validated in OpenVINO CPU"




def emit(model: IRModel, out_dir: Path, options: EmitOptions) -> Artifact:
    """The IR OpenVINO's ONNX front end reads; converted again with shifted normalisation when the
    CPU plugin's kernels (the MVN a LayerNormalization becomes, at f32) miss the reference on
    constant frames (`norm_fallback`)."""

    return screened_ir(model, lambda ir, folder: _emit(ir, folder, options), out_dir, what="IR")


def _emit(model: IRModel, out_dir: Path, options: EmitOptions) -> Artifact:

    ov = require_openvino("the OpenVINO target")
    precision = options.precision
    opts = options.target or OpenVINOOptions()
    calibration = load_calibration(options.calibration, model) if options.calibration and precision == "int8" else None
    if opts.int8_mode == "weights":
        calibration = None
    ov_model, details = build(model, precision, calibration=calibration, int8_mode=opts.int8_mode, budget=opts.budget)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "model.xml"
    files = save(ov_model, path, compress_to_fp16=precision == "fp16")
    reference = None
    if calibration:

        reference = calibration_reference(model, calibration)  # judged in distribution, as the ONNX INT8 models are
    return Artifact(
        target=NAME, runtime=RUNTIME, path=path, files=files, precision=precision,
        details={"format": "openvino-ir", "openvino": ov.__version__, "route": "onnx -> OpenVINO ONNX front end (Core.read_model) -> save_model",
                 "weights": "fp16" if precision == "fp16" else ("int8" if precision == "int8" else "fp32"), **details},
        runner="openvino", runner_options={"precision": details["inference_precision"]}, reference=reference,
    )


def preflight(ir: IRModel, options: EmitOptions | None = None) -> Preflight:
    """Every node OpenVINO's ONNX front end cannot convert (converted partially: the leftovers stay framework nodes)."""
    import tempfile


    ov = require_openvino("the OpenVINO target")
    pre = Preflight(NAME, RUNTIME, ov.__version__, opset_of(ir.model), None, nodes=len(ir.model.graph.node))
    from openvino.frontend import FrontEndManager

    with tempfile.TemporaryDirectory(prefix="modelport-ovpre-") as tmp:
        path = Path(tmp) / "model.onnx"
        save_onnx(ir.model, path)
        fe = FrontEndManager().load_by_framework("onnx")
        try:
            partial = fe.convert_partially(fe.load(str(path)))
        except Exception as e:
            first = one_line(e)
            pre.unsupported.append({"node": "(model)", "op": "model", "reason": f"OpenVINO's ONNX front end failed: {first}"})
            return pre
    # a framework node is named after its ONNX node, or after its first output when that has no name
    nodes = {}
    for i, n in enumerate(ir.model.graph.node):
        for key in (n.name, *n.output[:1]):
            if key:
                nodes.setdefault(key, (i, n))
    for op in partial.get_ordered_ops():
        if "FrameworkNode" not in op.get_type_name():
            continue
        friendly = op.get_friendly_name()
        found = nodes.get(friendly)
        if found is None:
            pre.unsupported.append({"node": friendly, "op": friendly, "reason": "OpenVINO's ONNX front end left it unconverted"})
            continue
        i, n = found
        pre.unsupported.append({"node": node_name(n, i), "op": n.op_type,
                                "reason": f"no OpenVINO conversion for {n.domain or 'ai.onnx'}::{n.op_type}"})
    return pre
