"""The ONNX IR version the installed onnxruntime loads, and lowering a model's IR version to it."""

from __future__ import annotations

_MAX_ORT_IR: int | None = None


def max_onnxruntime_ir_version() -> int:
    """The highest ONNX IR version the installed onnxruntime loads (probed once with a tiny model)."""
    global _MAX_ORT_IR
    if _MAX_ORT_IR is None:
        import onnx
        import onnxruntime as ort
        from onnx import TensorProto, helper

        graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "probe",
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
        _MAX_ORT_IR = 3
        for version in range(onnx.IR_VERSION, 3, -1):
            model.ir_version = version
            try:
                ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
            except Exception:
                continue
            _MAX_ORT_IR = version
            break
    return _MAX_ORT_IR


def fit_ir_version(model) -> str | None:
    """Lower the model's IR version to what onnxruntime loads, in place; returns a note when changed.

    Files written by a newer onnx (e.g. IR 14) than the runtime knows are common; the IR version
    only gates file-format features, and the opsets still decide what the graph means.
    """
    top = max_onnxruntime_ir_version()
    if model.ir_version > top:
        note = f"IR version lowered from {model.ir_version} to {top} (the newest onnxruntime {_ort_version()} loads)"
        model.ir_version = top
        return note
    return None


def _ort_version() -> str:
    import onnxruntime

    return onnxruntime.__version__
