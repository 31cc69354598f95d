"""FP16: mixed precision that keeps the nodes FP16 cannot represent in FP32.

Conversion uses onnxruntime's `transformers.float16` converter (onnxconverter-common's breaks
BERT-style graphs: a Gather output typed float16 where onnxruntime expects float). Before
converting, the FP32 model is run on the reference inputs with its activations exposed (in
bounded batches): every node that produces or consumes a value whose magnitude, times a
headroom factor, passes 65504 is block-listed and stays FP32. After converting, parity with the
references is checked; while it fails, the first diverging node is localised and block-listed
too, up to `max_rounds` times. The nodes kept in FP32 are returned for the report.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from modelport.deps import require
from modelport.ir import IRModel
from modelport.optimize import Pass, PassResult
from modelport.optimize.model_tools import name_nodes, with_model
from modelport.runtimes.onnxruntime import OnnxRuntimeRunner
from modelport.validation import Tolerance, check, tolerance_for
from modelport.validation.localize import first_divergence, magnitudes

FP16_MAX = 65504.0


@dataclass
class Fp16Info:
    kept_fp32: list[str] = field(default_factory=list)
    overflow: list[str] = field(default_factory=list)
    diverged: list[dict] = field(default_factory=list)
    rounds: int = 0
    parity_ok: bool | None = None

    def to_dict(self) -> dict:
        return {"kept_fp32": self.kept_fp32, "overflow_nodes": self.overflow, "diverged": self.diverged,
                "rounds": self.rounds, "parity_ok": self.parity_ok}


def _convert(model, *, keep_io_types: bool, node_block_list: list[str], op_block_list: list[str] | None):
    import onnx


    float16 = require("onnxruntime.transformers.float16", purpose="FP16 conversion")
    m = onnx.ModelProto()
    m.CopyFrom(model)
    from modelport.optimize.model_tools import drop_value_info, is_large

    drop_value_info(m)
    out = float16.convert_float_to_float16(
        m, keep_io_types=keep_io_types, node_block_list=sorted(node_block_list) or None,
        op_block_list=op_block_list, disable_shape_infer=is_large(m),
    )
    drop_cast_roundtrips(out, set(node_block_list))
    return out


def drop_cast_roundtrips(model, fp32_nodes: set[str]) -> int:
    """Remove FP32→FP16→FP32 Cast pairs between block-listed nodes, in place; returns how many.

    The converter casts every block-listed node's output to FP16 and back, even when the
    consumer is block-listed too: a value above 65504 then overflows on the way. Consumers of
    the round trip read the FP32 value directly instead.
    """
    fp32_values = {t for n in model.graph.node if n.name in fp32_nodes for t in n.output}
    graph_outputs = {o.name for o in model.graph.output}
    producers = {t: n for n in model.graph.node for t in n.output}
    rename: dict[str, str] = {}
    for n in model.graph.node:
        if n.op_type != "Cast" or n.output[0] in graph_outputs:
            continue
        to = next((a.i for a in n.attribute if a.name == "to"), None)
        src = producers.get(n.input[0])
        if to != 1 or src is None or src.op_type != "Cast" or src.input[0] not in fp32_values:
            continue
        if next((a.i for a in src.attribute if a.name == "to"), None) == 10:
            rename[n.output[0]] = src.input[0]
    if not rename:
        return 0
    for n in model.graph.node:
        for i, t in enumerate(n.input):
            if t in rename:
                n.input[i] = rename[t]
    _remove_unused(model)
    return len(rename)


def _remove_unused(model) -> None:
    """Drop nodes no graph output depends on (the graph need not be sorted), in place."""
    producers = {t: i for i, n in enumerate(model.graph.node) for t in n.output}
    live: set[int] = set()
    stack = [o.name for o in model.graph.output]
    while stack:
        i = producers.get(stack.pop())
        if i is None or i in live:
            continue
        live.add(i)
        node = model.graph.node[i]
        stack.extend(t for t in node.input if t)
        stack.extend(_subgraph_inputs(node))
    keep = [n for i, n in enumerate(model.graph.node) if i in live]
    del model.graph.node[:]
    model.graph.node.extend(keep)


def _subgraph_inputs(node) -> list[str]:
    names = []
    for a in node.attribute:
        for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
            for n in g.node:
                names.extend(n.input)
                names.extend(_subgraph_inputs(n))
    return names


def overflow_nodes(model, feeds, *, headroom: float = 2.0, batch: int = 32) -> list[str]:
    """Nodes producing or consuming a float value with |x| * headroom > 65504 on `feeds`."""
    import numpy as np


    mags = magnitudes(model, feeds, batch=batch)
    for name, arr in feeds.items():
        a = np.asarray(arr)
        if np.issubdtype(a.dtype, np.floating) and a.size:
            mags[name] = float(np.abs(a).max())
    hot = {t for t, m in mags.items() if m * headroom > FP16_MAX}
    return [n.name for n in model.graph.node if hot & (set(n.output) | set(n.input))]


def convert_fp16(ir: IRModel, *, keep_io_types: bool = True, op_block_list: list[str] | None = None,
                 node_block_list: list[str] | None = None, auto_block: bool = True, tol: Tolerance | None = None,
                 max_rounds: int = 8, batch: int = 32) -> tuple[IRModel, Fp16Info]:
    """(FP16 IRModel, what was kept in FP32). Without reference data, no automatic block-listing."""
    import onnx


    tol = tol or tolerance_for("fp16")
    base = onnx.ModelProto()
    base.CopyFrom(ir.model)
    name_nodes(base)
    info = Fp16Info()
    block = set(node_block_list or [])
    ref = ir.reference  # every set, the sweep's constant frames too: half precision holds their magnitudes
    if auto_block and ref is not None:  # every sample set: the ends of the input range overflow first
        info.overflow = sorted({n for s in ref.sets() for n in overflow_nodes(base, s.inputs, batch=batch)})
        block |= set(info.overflow)
    while True:
        # Localisation compares against FP32 tensors, so the probe keeps FP32 I/O.
        probe = _convert(base, keep_io_types=True, node_block_list=sorted(block), op_block_list=op_block_list)
        if not auto_block or ref is None:
            break
        parity = check(OnnxRuntimeRunner(probe), ref, tol, "fp16")
        info.parity_ok = parity.ok
        if parity.ok or info.rounds >= max_rounds:
            break
        info.rounds += 1
        worst = parity.worst()  # localised on the sample set that failed (silence, a range end, …)
        feeds = next((s.inputs for s in ref.sets() if worst and s.kind == worst.sample), ref.inputs)
        div = first_divergence(base, probe, feeds, threshold=max(tol.rtol, 1e-3) * 5, batch=batch, skip=block,
                               worst_if_none=True)
        if div is None:
            break
        info.diverged.append(div.to_dict())
        block.add(div.node)
    final = probe if keep_io_types else _convert(base, keep_io_types=False, node_block_list=sorted(block),
                                                 op_block_list=op_block_list)
    info.kept_fp32 = sorted(block)
    out = with_model(ir, final)
    if not keep_io_types:
        for spec in (*out.inputs, *out.outputs):
            if spec.dtype == "float32":
                spec.dtype = "float16"
    out.provenance["precision"] = "fp16"
    out.provenance["fp16"] = info.to_dict()
    return out, info


def to_fp16(ir: IRModel, *, keep_io_types: bool = True, op_block_list: list[str] | None = None,
            node_block_list: list[str] | None = None, auto_block: bool = True) -> IRModel:
    """The IR converted to FP16, nodes that overflow or lose accuracy kept in FP32.

    The nodes kept in FP32 are listed in `result.provenance["fp16"]["kept_fp32"]`.
    """
    return convert_fp16(ir, keep_io_types=keep_io_types, op_block_list=op_block_list,
                        node_block_list=node_block_list, auto_block=auto_block)[0]


class Float16Pass(Pass):
    name = "fp16"
    description = "FP16 weights and activations; overflowing or diverging nodes kept in FP32"
    precision = "fp16"
    float_weights = True

    def __init__(self, *, keep_io_types: bool = True, auto_block: bool = True, node_block_list=None, op_block_list=None):
        self.keep_io_types = keep_io_types
        self.auto_block = auto_block
        self.node_block_list = node_block_list
        self.op_block_list = op_block_list

    def apply(self, ir: IRModel) -> PassResult:
        out, info = convert_fp16(ir, keep_io_types=self.keep_io_types, auto_block=self.auto_block,
                                 node_block_list=self.node_block_list, op_block_list=self.op_block_list)
        return PassResult(out, True, info.to_dict())
