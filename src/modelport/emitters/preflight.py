"""Before converting: can the target runtime, as installed, represent this model?

Each emitter module exports `preflight(ir, options) -> Preflight`, checked against the installed
runtime's own knowledge where it can be read without running anything: onnxruntime's registered
CPU kernels (`emitters/ort.py`), onnx2tf's op converters (`emitters/tflite.py`), TensorRT's ONNX
parser matrix (`emitters/tensorrt.py`), the PyTorch code generator's converters. The opset is
moved into the runtime's range with the ONNX version converter when the model is outside it
(`fit_opset`), and every node the target cannot map is collected (all of them, not just the
first). `check_targets` runs the preflight of every target of a run before anything is emitted
and reports every refusal of every target in one `UnsupportedError` (exit 2).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from modelport.emitters import get_emitter
from modelport.errors import UnsupportedError, one_line
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
    reason: str | None = None  # the refusal in the target's own words, instead of the node listing
    hint: str | None = None

    @property
    def ok(self) -> bool:
        return not self.unsupported

    def to_dict(self) -> dict:
        return {"target": self.target, "runtime": self.runtime, "runtime_version": self.runtime_version,
                "opset": self.opset, "opset_range": list(self.opset_range) if self.opset_range else None,
                "nodes": self.nodes, "ok": self.ok, "unsupported": self.unsupported,
                "warnings": self.warnings, "notes": self.notes}

    def op_counts(self) -> str:
        """'BitwiseAnd x1, Det x2': the unsupported ops and how many nodes each."""
        return ", ".join(f"{op} x{n}" for op, n in sorted(Counter(u["op"] for u in self.unsupported).items()))

    def raise_if_unsupported(self, path=None) -> None:
        if self.ok:
            return
        listed = "; ".join(f"{u['node']} ({u['op']}): {u['reason']}" for u in self.unsupported[:MAX_LISTED])
        more = f"; and {len(self.unsupported) - MAX_LISTED} more" if len(self.unsupported) > MAX_LISTED else ""
        err = UnsupportedError(
            self.reason or f"{self.runtime} cannot represent {len(self.unsupported)} node(s) of this model: {listed}{more}",
            path=path, hint=self.hint or f"{self.runtime} {self.runtime_version or ''}".strip() + f" checked for --to {self.target}",
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
                         f"converter could not move it to {target}: {one_line(e)}")
        pre.unsupported.append({"node": "(model)", "op": f"opset {opset}", "reason": f"outside {lo}..{hi}"})
        return ir
    pre.notes.append(f"opset converted {opset} -> {target} for {pre.runtime}")
    pre.opset = target
    out = ir.clone(converted)
    out.provenance["opset"] = target
    return out


def node_name(node, i: int) -> str:
    return node.name or f"{node.op_type}_{i}"


def check_targets(ir: IRModel, targets: list[str], options, path=None) -> list[Preflight]:
    """The preflight of every target, all run before anything is emitted. One refusing target
    raises its own error; several raise one error naming, per target, the ops and their counts."""

    found = [get_emitter(t).preflight(ir, options) for t in targets]
    refused = [p for p in found if not p.ok]
    if len(refused) == 1:
        refused[0].raise_if_unsupported(path)
    if refused:
        per_target = "; ".join(f"--to {p.target} ({p.runtime}): {p.op_counts()}" for p in refused)
        raise UnsupportedError(f"{len(refused)} targets cannot represent this model: {per_target}", path=path,
                               hint="each target's preflight ran before anything was emitted",
                               preflight=[p.to_dict() for p in refused])
    return found
