"""Before converting: can the target runtime, as installed, represent this model?

Each target is checked against the installed runtime's own knowledge where it can be read
without running anything: onnxruntime's registered CPU kernels, onnx2tf's op converters (the
route to TFLite builtins), and TensorRT's ONNX parser matrix (`trt_support`). The opset is
moved into the runtime's range with the ONNX version converter when the model is outside it,
and every node the target cannot map is collected (all of them, not just the first) so the
user sees the whole list at once. An unsupported node is `UnsupportedError` (exit 2), raised
before any output is written.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path

from modelport.errors import UnsupportedError
from modelport.ir import IRModel

MAX_LISTED = 12


@dataclass
class Preflight:
    target: str
    runtime: str
    runtime_version: str | None
    opset: int | None
    opset_range: tuple[int, int] | None
    nodes: int = 0
    unsupported: list[dict] = field(default_factory=list)  # {node, op, reason}
    warnings: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.unsupported

    def to_dict(self) -> dict:
        return {"target": self.target, "runtime": self.runtime, "runtime_version": self.runtime_version,
                "opset": self.opset, "opset_range": list(self.opset_range) if self.opset_range else None,
                "nodes": self.nodes, "ok": self.ok, "unsupported": self.unsupported,
                "warnings": self.warnings, "notes": self.notes}

    def raise_if_unsupported(self, path=None) -> None:
        if self.ok:
            return
        listed = "; ".join(f"{u['node']} ({u['op']}): {u['reason']}" for u in self.unsupported[:MAX_LISTED])
        more = f"; and {len(self.unsupported) - MAX_LISTED} more" if len(self.unsupported) > MAX_LISTED else ""
        err = UnsupportedError(
            f"{self.runtime} cannot represent {len(self.unsupported)} node(s) of this model: {listed}{more}",
            path=path, hint=f"{self.runtime} {self.runtime_version or ''}".strip() + f" checked for --to {self.target}",
            preflight=self.to_dict(),
        )
        raise err


def opset_of(model) -> int | None:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)


def fit_opset(ir: IRModel, lo: int, hi: int, pre: Preflight) -> IRModel:
    """The IR with its opset moved into [lo, hi] (ONNX version converter), or unchanged."""
    opset = opset_of(ir.model)
    if opset is None or lo <= opset <= hi:
        return ir
    target = hi if opset > hi else lo
    from onnx import version_converter

    try:
        converted = version_converter.convert_version(ir.model, target)
    except Exception as e:  # the converter raises bare RuntimeError/ValueError
        pre.notes.append(f"opset {opset} is outside {pre.runtime}'s range {lo}..{hi} and the ONNX version "
                         f"converter could not move it to {target}: {str(e).splitlines()[0]}")
        pre.unsupported.append({"node": "(model)", "op": f"opset {opset}", "reason": f"outside {lo}..{hi}"})
        return ir
    pre.notes.append(f"opset converted {opset} -> {target} for {pre.runtime}")
    pre.opset = target
    out = ir.clone(converted)
    out.provenance["opset"] = target
    return out


def _node_name(node, i: int) -> str:
    return node.name or f"{node.op_type}_{i}"


# --- onnxruntime -----------------------------------------------------------------------------

_ORT_KERNELS: dict[tuple[str, str], list[tuple[int, int]]] | None = None


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


def check_ort(ir: IRModel) -> tuple[IRModel, Preflight]:
    import onnx
    import onnxruntime

    from modelport.onnx_io import max_onnxruntime_ir_version

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
        if (node.domain, node.op_type) in functions:
            continue
        ranges = kernels.get((dom, node.op_type))
        if not ranges:
            # ops defined as functions in ONNX (e.g. Gelu at some opsets) are expanded by onnxruntime
            if dom == "" and _is_function_op(node.op_type, opsets.get("", 0)):
                continue
            pre.unsupported.append({"node": _node_name(node, i), "op": node.op_type,
                                    "reason": f"no onnxruntime CPU kernel for {dom or 'ai.onnx'}::{node.op_type}"})
            continue
        since = _since_version(node.op_type, dom, opsets.get(dom, 1))
        if since is not None and not any(a <= since <= b for a, b in ranges):
            if dom == "" and _is_function_op(node.op_type, opsets.get("", 0)):
                continue
            pre.unsupported.append({"node": _node_name(node, i), "op": node.op_type,
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


# --- TFLite (through onnx2tf) ----------------------------------------------------------------

def onnx2tf_ops() -> set[str]:
    """The ONNX ops onnx2tf has a converter for, read from its package without importing it."""
    spec = importlib.util.find_spec("onnx2tf")
    if spec is None or not spec.submodule_search_locations:
        from modelport.deps import require

        require("onnx2tf", purpose="converting to TFLite")
    folder = Path(list(spec.submodule_search_locations)[0]) / "ops"
    return {p.stem for p in folder.glob("*.py") if p.stem[:1].isupper()}


def check_tflite(ir: IRModel) -> tuple[IRModel, Preflight]:
    from modelport.deps import version_of

    known = onnx2tf_ops()
    pre = Preflight("tflite", "onnx2tf", version_of("onnx2tf"), opset_of(ir.model), None)
    pre.nodes = len(ir.model.graph.node)
    for i, node in enumerate(ir.model.graph.node):
        if node.domain not in ("", "ai.onnx"):
            pre.unsupported.append({"node": _node_name(node, i), "op": f"{node.domain}::{node.op_type}",
                                    "reason": "custom-domain op: no TFLite builtin for it"})
        elif node.op_type not in known:
            pre.unsupported.append({"node": _node_name(node, i), "op": node.op_type,
                                    "reason": f"onnx2tf has no converter for {node.op_type}"})
    for spec in ir.inputs:
        if spec.dtype in ("float64", "bfloat16") or spec.dtype.startswith("uint") and spec.dtype != "uint8":
            pre.warnings.append({"node": spec.name, "op": "input", "reason": f"input dtype {spec.dtype} is cast by TFLite"})
    return ir, pre


# --- TensorRT --------------------------------------------------------------------------------

def check_tensorrt(ir: IRModel) -> tuple[IRModel, Preflight, object]:
    from modelport.deps import version_of
    from modelport.emitters import trt_support

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


def run(ir: IRModel, target: str) -> tuple[IRModel, Preflight]:
    """The preflight of `target` (tflite, tensorrt, ort); the IR may come back opset-converted."""
    if target == "tensorrt":
        ir, pre, _ = check_tensorrt(ir)
        return ir, pre
    if target == "tflite":
        return check_tflite(ir)
    if target in ("ort", "onnx"):
        return check_ort(ir)
    raise ValueError(f"no preflight for target '{target}'")
