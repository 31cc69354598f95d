"""ORT-format target: model.ort written by onnxruntime, validated in onnxruntime, fp32/fp16/int8."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from modelport.emitters.ort import save_ort
from modelport.emitters.ort_canonical import _read_resolver, canonical_ort, write_canonical
from modelport.orchestration import ConvertOptions, convert


def many_ops_model():
    """A small CNN-like graph with a dozen operator kinds, so the kernel resolver has many entries."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)

    def init(name, *shape):
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)

    nodes = [
        helper.make_node("Conv", ["x", "cw", "cb"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Sigmoid", ["r"], ["s"]),
        helper.make_node("Mul", ["r", "s"], ["m"]),
        helper.make_node("Tanh", ["m"], ["t"]),
        helper.make_node("Add", ["t", "c"], ["a"]),
        helper.make_node("MaxPool", ["a"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("GlobalAveragePool", ["p"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "gw", "gb"], ["l"], transB=1),
        helper.make_node("Softmax", ["l"], ["prob"], axis=1),
        helper.make_node("Sqrt", ["prob"], ["sq"]),
        helper.make_node("Exp", ["sq"], ["e"]),
        helper.make_node("Div", ["e", "prob"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "many", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 5])],
        initializer=[init("cw", 4, 3, 3, 3), init("cb", 4), init("gw", 5, 4), init("gb", 5)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def test_ort_file_is_byte_identical_on_every_save(tmp_path):
    """onnxruntime lays the kernel resolver out in heap-address order; ours is the same every time."""
    model = many_ops_model()
    paths = [tmp_path / f"run{i}.ort" for i in range(4)]
    layouts = {save_ort(model, p) for p in paths}
    assert layouts == {"canonical"}
    first = paths[0].read_bytes()
    assert all(p.read_bytes() == first for p in paths[1:])


def test_canonical_layout_keeps_model_and_resolver(tmp_path):
    model = many_ops_model()
    raw = tmp_path / "raw.ort"
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    so.optimized_model_filepath = str(raw)
    so.add_session_config_entry("session.save_model_format", "ORT")
    ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    data = raw.read_bytes()
    canon = tmp_path / "canon.ort"
    canon.write_bytes(canonical_ort(data))
    assert canonical_ort(canon.read_bytes()) == canon.read_bytes()  # a fixed point

    def resolver(buf):
        buf = bytearray(buf)
        root = int.from_bytes(buf[0:4], "little")
        from flatbuffers.table import Table

        tab = Table(buf, root)
        return _read_resolver(buf, tab.Indirect(tab.Pos + tab.Offset(10)))[0]

    entries = resolver(canon.read_bytes())
    assert entries == resolver(data) and len(entries) == 14
    x = np.random.default_rng(4).standard_normal((2, 3, 8, 8)).astype(np.float32)
    want = ort.InferenceSession(str(raw), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = ort.InferenceSession(str(canon), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, want)


def test_a_file_rewritten_in_place_is_the_canonical_bytes(tmp_path):
    """`write_canonical` (what the emitter uses: the file read where it is, one copy in memory) gives
    what `canonical_ort` gives, and prepacking off (the emitter's session only writes the file) changes
    nothing in it."""
    model = many_ops_model()
    files = []
    for prepacking in ("0", "1"):
        raw = tmp_path / f"raw{prepacking}.ort"
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        so.optimized_model_filepath = str(raw)
        so.add_session_config_entry("session.save_model_format", "ORT")
        so.add_session_config_entry("session.disable_prepacking", prepacking)
        ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        want = canonical_ort(raw.read_bytes())
        write_canonical(raw)
        assert raw.read_bytes() == want
        files.append(want)
    assert files[0] == files[1]
    (tmp_path / "cut.ort").write_bytes(b"ORTM" * 3)
    with pytest.raises(ValueError, match="not an ORT file"):
        write_canonical(tmp_path / "cut.ort")
    assert (tmp_path / "cut.ort").read_bytes() == b"ORTM" * 3


EMIT = """
import tempfile
from pathlib import Path
import psutil
from modelport.emitters import EmitOptions
from modelport.emitters.ort import emit
from modelport.run.memory import own_peak
from tests.alone import matmul_ir, reset_peak
ir = matmul_ir(48)  # 48 weights of 4 MiB
reset_peak()
now = psutil.Process().memory_info().rss
with tempfile.TemporaryDirectory() as d:
    art = emit(ir, Path(d), EmitOptions())
    size = Path(art.path).stat().st_size
print(own_peak() - now, size, art.details["file_layout"], sum(len(t.raw_data) for t in ir.model.graph.initializer))
"""


def test_writing_a_large_ort_file_holds_its_weights_about_once():
    """A 201 MB model emitted in a process of its own: while onnxruntime writes the file the IR's
    weights wait in a file, the session packs no kernels' weights, and the file is made canonical
    in place; the peak above what the process held with the IR grew by 0.83x the weights (5.2x
    before: the IR's serialisation beside it, prepacked MatMul weights, the file read whole and
    rebuilt twice over). The IR has its weights back afterwards."""
    from tests.alone import run_alone

    grew, size, layout, held = run_alone(EMIT).split()
    assert layout == "canonical" and int(held) == 48 << 22
    assert int(size) > 200e6 and int(grew) < 1.25 * int(size), (int(grew) / int(size), size)


@pytest.mark.parametrize("precision", ["fp32", "fp16", "int8"])
def test_onnx_to_ort(tiny_onnx, tmp_path, precision):
    out = tmp_path / "out"
    report = convert(tiny_onnx, out, ConvertOptions(targets=["ort"], precision=precision))
    hop = report["parity"][-1]
    assert "ort" in hop["hop"] and hop["ok"]
    art = report["artifacts"][0]
    assert art["path"] == "model.ort" and art["precision"] == precision
    assert (out / "model.ort").read_bytes()[4:8] == b"ORTM"  # the ORT flatbuffer identifier
    assert "ai.onnx;" in (out / "required_operators.config").read_text()
    sess = ort.InferenceSession(str(out / "model.ort"), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(2).standard_normal((5, 8)).astype(np.float32)
    ref = ort.InferenceSession(str(tiny_onnx), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], ref, atol={"fp32": 1e-5, "fp16": 1e-2, "int8": 0.2}[precision])


def test_pytorch_cnn_to_ort(tmp_path):
    from modelport.zoo_builders.pytorch import cnn_small

    report = convert(cnn_small(), tmp_path / "out", ConvertOptions(targets=["ort", "onnx"], inputs=["x:batch,3,32,32"]))
    assert [a["target"] for a in report["artifacts"]] == ["ort", "onnx"]
    assert all(p["ok"] for p in report["parity"])


def test_constant_nodes_pass_preflight_and_run(tmp_path):
    """onnxruntime turns Constant nodes into initializers at load; the preflight must not refuse them."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from modelport.emitters.ort import preflight
    from modelport.ir import IRModel

    scale = np.array([0.5, -2.0, 3.0, 1.5], np.float32)
    nodes = [
        helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(scale, "k")),
        helper.make_node("Constant", [], ["one"], value_float=1.0),
        helper.make_node("Mul", ["x", "k"], ["m"]),
        helper.make_node("Add", ["m", "one"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "consts", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    assert preflight(IRModel(model, [], [])).unsupported == []
    src = tmp_path / "consts.onnx"
    onnx.save(model, src)
    out = tmp_path / "out"
    report = convert(src, out, ConvertOptions(targets=["ort"]))
    assert all(p["ok"] for p in report["parity"])
    x = np.random.default_rng(5).standard_normal((3, 4)).astype(np.float32)
    got = ort.InferenceSession(str(out / "model.ort"), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, x * scale + 1.0, rtol=1e-6)
