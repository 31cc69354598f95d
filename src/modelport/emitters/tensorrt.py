"""The TensorRT target: `model.plan` plus `tensorrt/` (ONNX, build plan, trtexec command, build script).

Order of work: (1) a static check of every node against TensorRT's ONNX parser matrix — an
unsupported node fails the run (exit 2) naming the node, before anything is written;
(2) the build plan (`tensorrt/plan.json`, `trtexec.sh`, `build_engine.py`, `compat.json`, the
ONNX file and, for FP16, an FP16 ONNX file for TensorRT 11's strongly typed builds);
(3) where `tensorrt` and a CUDA GPU are present, the engine is built with the same build script
and validated by the pipeline through the TensorRT runner.

Without TensorRT or a GPU: with `plan_only` the run succeeds with the plan and no engine (the
report's `validated: false` says so, and `--strict` fails it); without
it the run fails with exit 5 and, like every failed run, leaves no output (the message says to
pass --plan-only).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from modelport.emitters import Artifact, EmitOptions, trt_plan, trt_support
from modelport.emitters.precision_ir import at_precision
from modelport.emitters.preflight import Preflight, fit_opset, opset_of
from modelport.emitters.tensorrt_options import TensorRTOptions
from modelport.errors import MissingDependencyError
from modelport.ir import IRModel
from modelport.onnxfile.contract_stamp import stamped_contract
from modelport.onnxfile.onnx_io import save_onnx
from modelport.run.quiet_call import captured_output
from modelport.runtimes import trt_build_script
from modelport.runtimes.trt_build_script import build, gpu_info

NAME = "tensorrt"
RUNTIME = "tensorrt"
DESCRIPTION = "TensorRT engine (.plan) + build plan; static parser check on CPU, build on a CUDA GPU"


def installed_major() -> int | None:
    from modelport.deps import version_of

    v = version_of("tensorrt")
    try:
        return int(v.split(".")[0]) if v else None
    except ValueError:
        return None


def build_environment() -> str | None:
    """Why an engine cannot be built here (no tensorrt, no CUDA GPU), or None when it can."""
    import importlib.util

    if importlib.util.find_spec("tensorrt") is None:
        return "the 'tensorrt' Python package is not installed"

    if not gpu_info():
        return "no CUDA GPU is visible"
    return None


def write_plan(ir: IRModel, folder: Path, plan, check) -> list[Path]:

    folder.mkdir(parents=True, exist_ok=True)
    with stamped_contract(ir):
        files = save_onnx(ir.model, folder / plan.onnx)
    if plan.onnx_fp16:

        files += save_onnx(at_precision(ir, "fp16").model, folder / plan.onnx_fp16)
    (folder / "plan.json").write_text(json.dumps(plan.to_dict(), indent=2) + "\n")
    (folder / "compat.json").write_text(json.dumps(check.to_dict(), indent=2) + "\n")
    sh = folder / "trtexec.sh"
    sh.write_text(trt_plan.trtexec_script(plan))
    sh.chmod(0o755)
    script = folder / "build_engine.py"
    shutil.copyfile(trt_build_script.__file__, script)
    return [*files, folder / "plan.json", folder / "compat.json", sh, script]




def emit(model: IRModel, out_dir: Path, options: EmitOptions) -> Artifact:

    opts = options.target or TensorRTOptions()
    plan_only = opts.plan_only
    ir, pre, check = parser_check(model)
    pre.raise_if_unsupported()
    plan = trt_plan.make_plan(ir, options.precision, shapes=list(opts.shapes), workspace_mib=opts.workspace)
    major = installed_major()
    cannot = None if plan_only else build_environment()
    if cannot:
        raise MissingDependencyError(
            f"cannot build a TensorRT engine here: {cannot}. Static check: {check.summary()}",
            hint='pip install "modelport[tensorrt]" on a machine with an NVIDIA GPU, or pass --plan-only to write '
                 "the build plan (tensorrt/) without building",
        )
    folder = out_dir / "tensorrt"
    files = write_plan(ir, folder, plan, check)
    details = {"plan_only": plan_only, "check": check.to_dict(all_nodes=False), "preflight": pre.to_dict(),
               "plan": plan.to_dict(), "trtexec": {"10": trt_plan.trtexec_command(plan, 10),
                                                    "11": trt_plan.trtexec_command(plan, 11)},
               "tensorrt": None}
    if plan_only:
        return Artifact(target=NAME, runtime=RUNTIME, path=folder, files=files, precision=options.precision,
                        details=details, runner=None,
                        not_validated="--plan-only: the build plan is written and no engine was built, so nothing ran")

    with captured_output(folder.parent / ".trt-build.log", "TensorRT builder"):
        engine = build(folder, log=lambda *_: None)
    (folder.parent / ".trt-build.log").unlink(missing_ok=True)
    meta = json.loads((folder / "engine.json").read_text())
    details.update(tensorrt=meta["tensorrt"], gpu=meta["gpu"], compute_capability=meta["compute_capability"],
                   major=major)
    return Artifact(target=NAME, runtime=RUNTIME, path=engine, files=[engine, *files, folder / "engine.json"],
                    precision=options.precision, details=details, runner="tensorrt",
                    runner_options={"output_names": [o.name for o in ir.outputs]})


# --- preflight: TensorRT's ONNX parser matrix ------------------------------------------------

def parser_check(ir: IRModel) -> tuple[IRModel, Preflight, object]:
    """The IR with its opset in TensorRT's range, the findings, and the parser matrix's node-by-node check."""
    from modelport.deps import version_of

    pre = Preflight("tensorrt", "TensorRT ONNX parser", version_of("tensorrt") or f"matrix {trt_support.TABLE_VERSION}",
                    opset_of(ir.model), trt_support.OPSET_RANGE)
    ir = fit_opset(ir, *trt_support.OPSET_RANGE, pre)
    check = trt_support.check_model(ir.model)
    pre.nodes = len(check.nodes)
    pre.unsupported += [{"node": c.node, "op": c.op, "reason": c.reason} for c in check.unsupported]
    pre.warnings += [{"node": c.node, "op": c.op, "reason": c.reason} for c in check.warnings]
    for issue in check.model_issues:
        if not issue.startswith("opset"):
            pre.unsupported.append({"node": "(model)", "op": "I/O", "reason": issue})
    return ir, pre, check


def preflight(ir: IRModel, options: EmitOptions | None = None) -> Preflight:
    return parser_check(ir)[1]
