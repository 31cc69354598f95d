"""The ORT-format target: `model.ort` for onnxruntime mobile and minimal builds, validated in onnxruntime.

The file is written by onnxruntime itself (a session saves its graph in ORT format) after the
hardware-independent "basic" optimizations only, so the same file runs on ARM phones and x86
servers. `required_operators.config` beside it lists the kernels a reduced onnxruntime build
needs. Precision fp16/int8 comes from the project's precision passes, which the optimisation stage
runs before the emitter (modelport.resolve.precisions).
"""

from __future__ import annotations

from pathlib import Path

from modelport.emitters import Artifact, EmitOptions
from modelport.emitters.ort_canonical import LayoutError, write_canonical
from modelport.emitters.preflight import Preflight, fit_opset, node_name, opset_of
from modelport.errors import BadInputError, one_line
from modelport.ir import IRModel
from modelport.onnxfile.ir_version_fit import max_onnxruntime_ir_version

NAME = "ort"
RUNTIME = "onnxruntime"
DESCRIPTION = "ORT format (.ort) for onnxruntime mobile, validated in onnxruntime"


def save_ort(model, path: Path) -> str:
    """Save `model` (a ModelProto, or the path of an ONNX file) as an ORT file at `path`; returns its
    layout ("canonical", or why not).

    onnxruntime places part of the file in a per-process order; the canonical layout makes reruns
    byte-identical (emitters/ort_canonical.py).
    """
    import onnxruntime as ort


    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    so.optimized_model_filepath = str(path)
    so.add_session_config_entry("session.save_model_format", "ORT")
    # the session only writes the file: the packed copies of the MatMul weights its kernels would
    # make are not in it (the same bytes either way), and took 0.8 GB on a 0.94 GB encoder
    so.add_session_config_entry("session.disable_prepacking", "1")
    try:
        source = str(model) if isinstance(model, Path) else model.SerializeToString()
        ort.InferenceSession(source, so, providers=["CPUExecutionProvider"])
    except Exception as e:
        raise BadInputError(f"onnxruntime cannot save the model in ORT format: {one_line(e)}") from None
    try:
        write_canonical(path)
    except LayoutError as e:
        return f"as written by onnxruntime ({e})"
    return "canonical"


def required_operators(model) -> str:
    """The reduced-build config line set: 'domain;opset;Op1,Op2'."""
    opsets = {o.domain or "ai.onnx": o.version for o in model.opset_import}
    ops: dict[str, set[str]] = {}
    for n in model.graph.node:
        ops.setdefault(n.domain or "ai.onnx", set()).add(n.op_type)
    lines = [f"{d};{opsets.get(d, 1)};{','.join(sorted(o))}" for d, o in sorted(ops.items())]
    return "\n".join(lines) + "\n"


def emit(model: IRModel, out_dir: Path, options: EmitOptions) -> Artifact:
    """The IR, at its precision already (the optimisation stage applies it: modelport.resolve.precisions), as an ORT file."""
    ir, pre = check(model)
    pre.raise_if_unsupported()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "model.ort"
    # onnxruntime reads a large model's weights from a file while this process holds only its graph
    # (the ORT file embeds them: the session and its writer hold them about three times over)
    with ir.weights_parked() as parked:
        layout = save_ort(parked or ir.model, path)
    config = out_dir / "required_operators.config"
    config.write_text(required_operators(ir.model))
    import onnxruntime

    return Artifact(
        target=NAME, runtime=RUNTIME, path=path, files=[path, config], precision=options.precision,
        details={"format": "ort", "onnxruntime": onnxruntime.__version__, "optimization": "basic", "file_layout": layout,
                 "nodes": len(ir.model.graph.node), "preflight": pre.to_dict()},
        runner="onnxruntime",
    )


# --- preflight: onnxruntime's CPU kernels ----------------------------------------------------

_ORT_KERNELS: dict[tuple[str, str], list[tuple[int, int]]] | None = None

# Ops onnxruntime resolves while loading the graph, with no kernel registered for them:
# a Constant node becomes an initializer before any kernel is looked up.
_RESOLVED_AT_LOAD = frozenset({("", "Constant")})


def ort_kernels() -> dict[tuple[str, str], list[tuple[int, int]]]:
    """(domain, op) -> version ranges of onnxruntime's CPU kernels."""
    global _ORT_KERNELS
    if _ORT_KERNELS is None:
        from onnxruntime.capi import onnxruntime_pybind11_state as C

        table: dict[tuple[str, str], list[tuple[int, int]]] = {}
        for k in C.get_all_opkernel_def():
            if k.provider != "CPUExecutionProvider":
                continue
            dom = "" if k.domain in ("", "ai.onnx") else k.domain
            table.setdefault((dom, k.op_name), []).append(tuple(k.version_range))
        _ORT_KERNELS = table
    return _ORT_KERNELS


def check(ir: IRModel) -> tuple[IRModel, Preflight]:
    """The IR fitted to onnxruntime (opset, IR version) and every node without a CPU kernel."""
    import onnx
    import onnxruntime


    hi = onnx.defs.onnx_opset_version()
    pre = Preflight("ort", "onnxruntime", onnxruntime.__version__, opset_of(ir.model), (7, hi))
    ir = fit_opset(ir, 7, hi, pre)
    model = ir.model
    if model.ir_version > max_onnxruntime_ir_version():
        pre.notes.append(f"IR version {model.ir_version} lowered to {max_onnxruntime_ir_version()}")
        ir = ir.clone()
        ir.model.ir_version = max_onnxruntime_ir_version()
        model = ir.model
    opsets = {("" if o.domain in ("", "ai.onnx") else o.domain): o.version for o in model.opset_import}
    kernels = ort_kernels()
    functions = {(f.domain, f.name) for f in model.functions}
    pre.nodes = len(model.graph.node)
    for i, node in enumerate(model.graph.node):
        dom = "" if node.domain in ("", "ai.onnx") else node.domain
        if (node.domain, node.op_type) in functions or (dom, node.op_type) in _RESOLVED_AT_LOAD:
            continue
        ranges = kernels.get((dom, node.op_type))
        if not ranges:
            # ops defined as functions in ONNX (e.g. Gelu at some opsets) are expanded by onnxruntime
            if dom == "" and _is_function_op(node.op_type, opsets.get("", 0)):
                continue
            pre.unsupported.append({"node": node_name(node, i), "op": node.op_type,
                                    "reason": f"no onnxruntime CPU kernel for {dom or 'ai.onnx'}::{node.op_type}"})
            continue
        since = _since_version(node.op_type, dom, opsets.get(dom, 1))
        if since is not None and not any(a <= since <= b for a, b in ranges):
            if dom == "" and _is_function_op(node.op_type, opsets.get("", 0)):
                continue
            pre.unsupported.append({"node": node_name(node, i), "op": node.op_type,
                                    "reason": f"onnxruntime has no CPU kernel for {node.op_type} version {since}"})
    return ir, pre


def _since_version(op: str, domain: str, opset: int) -> int | None:
    import onnx

    try:
        return onnx.defs.get_schema(op, opset, domain).since_version
    except Exception:
        return None


def _is_function_op(op: str, opset: int) -> bool:
    import onnx

    try:
        schema = onnx.defs.get_schema(op, opset, "")
    except Exception:
        return False
    return bool(schema.has_function or schema.has_context_dependent_function)


def preflight(ir: IRModel, options: EmitOptions | None = None) -> Preflight:
    return check(ir)[1]
