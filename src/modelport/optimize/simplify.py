"""onnx-simplifier: constant folding and shape-driven simplification by running the graph.

onnxsim serialises the whole model into one protobuf, so models over the protobuf limit are
passed over (reported as skipped); the folding/elimination passes still apply to them. It also
holds the model several times over while it works (a copy to simplify, its serialisation, its own
parse, onnxruntime's session for the folding, the result: a 1 GB encoder peaked at 8.8 GB in it,
against 2.6 GB for every other stage of `convert --optimize all`), so a model whose tensors reach
MAX_BYTES is passed over too, the row saying why.
"""

from __future__ import annotations

from modelport.deps import require
from modelport.errors import one_line
from modelport.ir import IRModel
from modelport.onnxfile.external_data_files import attach_external
from modelport.onnxfile.tensor_sizes import tensor_bytes
from modelport.optimize import Pass, PassResult
from modelport.run.progress import doing

MAX_BYTES = 512 << 20  # tensor data from which the pass is skipped (see the module docstring)


class OnnxSimPass(Pass):
    name = "simplify"
    description = "onnx-simplifier (onnxsim)"
    reads_stored = True  # it decides from the sizes alone; the copy it simplifies reads the weights in

    def apply(self, ir: IRModel) -> PassResult:
        from modelport.optimize.model_tools import drop_value_info, is_large, with_model

        if is_large(ir.model):
            return PassResult(ir, False, {"skipped": "model over the protobuf limit; onnxsim needs one protobuf"})

        size = tensor_bytes(ir.model)
        if size >= MAX_BYTES:
            return PassResult(ir, False, {"skipped": f"{size / 1e6:,.0f} MB of weights: onnxsim holds a "
                                                     f"model several times over (from {MAX_BYTES >> 20} MiB it is skipped)"})
        onnxsim = require("onnxsim", purpose="the 'simplify' pass")
        import onnx

        m = onnx.ModelProto()
        m.CopyFrom(ir.model)
        if ir.stored is not None:

            attach_external(m, ir.stored)
        drop_value_info(m)

        try:
            with doing("onnxsim"):
                out, ok = onnxsim.simplify(m)
        except Exception as e:  # onnxsim raises bare RuntimeErrors from its C++ core
            return PassResult(ir, False, {"skipped": f"onnxsim failed: {one_line(e)}"})
        if not ok:
            return PassResult(ir, False, {"skipped": "onnxsim's own check failed"})
        drop_value_info(out)
        changed = len(out.graph.node) != len(ir.model.graph.node) or out.graph.node != ir.model.graph.node
        return PassResult(with_model(ir, out), bool(changed), {})
