"""Weight-only MatMulNBits quantisation: bits, block size and symmetry as asked, the input untouched."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from modelport.errors import BadInputError
from modelport.optimize.weight_only import WeightOnlyOptions, quantize_weight_only


def _two_matmuls():
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((64, 32)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((32, 16)).astype(np.float32), "w2")
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 16])], [w1, w2])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("bits,block,symmetric", [(4, 16, True), (4, 32, False), (8, 32, True)])
def test_matmuls_become_matmulnbits(bits, block, symmetric):
    import onnxruntime as ort

    model = _two_matmuls()
    before = model.SerializeToString()
    q, details = quantize_weight_only(model, WeightOnlyOptions(bits=bits, block_size=block, symmetric=symmetric))
    assert model.SerializeToString() == before
    nodes = [n for n in q.graph.node if n.op_type == "MatMulNBits"]
    assert len(nodes) == details["quantized"] == 2 and details["matmuls"] == 2
    for n in nodes:
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        assert attrs["bits"] == bits and attrs["block_size"] == block
        assert (len(n.input) > 3 and n.input[3] != "") is (not symmetric)  # zero points only when asymmetric
    x = np.random.default_rng(1).standard_normal((3, 64)).astype(np.float32)
    ref = ort.InferenceSession(before, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = ort.InferenceSession(q.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    rel = np.abs(got - ref).max() / np.abs(ref).max()
    assert rel < (0.2 if bits == 4 else 0.02)


def test_options_are_checked():
    with pytest.raises(BadInputError, match="4 or 8 bits"):
        WeightOnlyOptions(bits=3)
    with pytest.raises(BadInputError, match="block-size 24"):
        WeightOnlyOptions(block_size=24)


def test_a_model_without_constant_matmul_weights_is_refused():
    graph = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["y"])], "g",
                              [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 64]),
                               helper.make_tensor_value_info("b", TensorProto.FLOAT, [64, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])])
    with pytest.raises(BadInputError, match="no MatMul with a constant weight"):
        quantize_weight_only(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), WeightOnlyOptions())
    onnx.checker.check_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


@pytest.mark.parametrize("bits", [4, 8])
def test_quantising_in_place_gives_the_same_model_as_on_a_copy(bits):
    """The text-generation route quantises the model where it is (`in_place`, no second copy of the
    float weights): the result must be the model quantising a copy gives, byte for byte."""
    options = WeightOnlyOptions(bits=bits, block_size=16)
    copied, details = quantize_weight_only(_two_matmuls(), options)
    work = _two_matmuls()
    in_place, details_in_place = quantize_weight_only(work, options, in_place=True)
    assert in_place.SerializeToString() == copied.SerializeToString() and details_in_place == details


@pytest.mark.parametrize("bits,symmetric", [(4, True), (4, False), (8, True), (8, False)])
def test_quantising_from_files_gives_the_model_quantising_in_memory_gives(tmp_path, bits, symmetric):
    """`quantize_stored` reads each weight from the data file and writes the quantised ones to a new
    one: the same nodes, initializers and outputs as `quantize_weight_only` on the model in memory."""
    import onnxruntime as ort

    from modelport.onnxfile.onnx_io import save_onnx
    from modelport.optimize.weight_only import quantize_stored
    from modelport.optimize.weight_store import WeightStore

    options = WeightOnlyOptions(bits=bits, block_size=16, symmetric=symmetric)
    memory, details = quantize_weight_only(_two_matmuls(), options)
    src = tmp_path / "src" / "model.onnx"
    src.parent.mkdir()
    save_onnx(_two_matmuls(), src, external=True)
    graph = onnx.load(str(src), load_external_data=False)
    assert all(t.data_location == TensorProto.EXTERNAL for t in graph.graph.initializer)
    out = tmp_path / "out" / "model.onnx"
    out.parent.mkdir()
    stored, stored_details = quantize_stored(graph, src.parent, out, options)
    assert stored_details == details
    assert any(t.data_location == TensorProto.EXTERNAL for t in stored.graph.initializer if t.name.endswith(f"_Q{bits}"))
    WeightStore(out.parent).attach(stored)

    def nodes(m):
        return [(n.op_type, n.domain, n.name, list(n.input), list(n.output), sorted(str(a) for a in n.attribute))
                for n in m.graph.node]

    def inits(m):
        return {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}

    assert nodes(stored) == nodes(memory)
    a, b = inits(stored), inits(memory)
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    x = np.random.default_rng(1).standard_normal((3, 64)).astype(np.float32)
    run = [ort.InferenceSession(p, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
           for p in (str(out), memory.SerializeToString())]
    assert np.array_equal(run[0], run[1])


def _tied_lm(vocab=40, hidden=64):
    """input_ids -> embedding rows -> a MatMul -> the embedding transposed (a tied output projection);
    the gathered rows are an output too."""
    rng = np.random.default_rng(2)
    table = rng.standard_normal((vocab, hidden)).astype(np.float32)
    inits = [numpy_helper.from_array(table, "embed.weight"),
             numpy_helper.from_array(rng.standard_normal((hidden, hidden)).astype(np.float32), "w"),
             numpy_helper.from_array(np.ascontiguousarray(table.T), "lm_head.weight_t")]
    nodes = [helper.make_node("Gather", ["embed.weight", "input_ids"], ["rows"], name="embed_tokens"),
             helper.make_node("MatMul", ["rows", "w"], ["h"], name="mix"),
             helper.make_node("MatMul", ["h", "lm_head.weight_t"], ["logits"], name="lm_head")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["b", "s"])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["b", "s", vocab]),
                               helper.make_tensor_value_info("rows", TensorProto.FLOAT, ["b", "s", hidden])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), table


def _dequantised(packed: np.ndarray, scales: np.ndarray, bits: int) -> np.ndarray:
    """MatMulNBits' symmetric weight [N, blocks, blob] back to float rows [N, K] (low nibble first)."""
    if bits == 4:
        q = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(packed.shape[0], packed.shape[1], -1)
    else:
        q = packed
    return ((q.astype(np.float32) - (1 << (bits - 1))) * scales[:, :, None]).reshape(packed.shape[0], -1)


@pytest.mark.parametrize("bits", [4, 8])
def test_a_tied_embedding_is_read_from_the_quantised_output_projection(bits):
    """With the config's tie: the embedding's Gather becomes GatherBlockQuantized over the output
    projection's MatMulNBits weight, the float table is gone, and each gathered row is the row of
    the dequantised projection, exactly (checked against the packing decoded here)."""
    import onnxruntime as ort

    model, table = _tied_lm()
    options = WeightOnlyOptions(bits=bits, block_size=32)
    q, details = quantize_weight_only(model, options, tied=True)
    assert details["embedding"].startswith("read from the quantised output projection")
    ops = [n.op_type for n in q.graph.node]
    assert "Gather" not in ops and ops.count("GatherBlockQuantized") == 1 and ops.count("MatMulNBits") == 2
    inits = {t.name: numpy_helper.to_array(t) for t in q.graph.initializer}
    assert "embed.weight" not in inits and "lm_head.weight_t" not in inits
    rows = _dequantised(inits[f"lm_head.weight_t_Q{bits}"], inits["lm_head.weight_t_scales"], bits)
    assert rows.shape == table.shape and np.abs(rows - table).max() < (0.5 if bits == 4 else 0.05)
    ids = np.array([[0, 7, 39, 7]], dtype=np.int64)
    logits, got = ort.InferenceSession(q.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"input_ids": ids})
    assert np.array_equal(got[0], rows[ids[0]])
    full = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"input_ids": ids})[0]
    assert np.abs(logits - full).max() / np.abs(full).max() < (0.35 if bits == 4 else 0.05)  # three int4 products


def test_an_untied_or_asymmetric_embedding_stays_a_float_gather():
    model, _ = _tied_lm()
    for options, tied in ((WeightOnlyOptions(bits=4, block_size=32), False), (WeightOnlyOptions(bits=4, block_size=32, symmetric=False), True)):
        q, details = quantize_weight_only(model, options, tied=tied)
        assert "embedding" not in details
        assert [n.op_type for n in q.graph.node].count("Gather") == 1
        assert "embed.weight" in {t.name for t in q.graph.initializer}


@pytest.mark.parametrize("bits", [4, 8])
def test_a_tied_embedding_from_files_is_the_one_in_memory(tmp_path, bits):
    """`quantize_stored` shares the table the same way, and never copies the float table into the
    new data file."""
    from modelport.onnxfile.onnx_io import save_onnx
    from modelport.optimize.weight_only import quantize_stored
    from modelport.optimize.weight_store import WeightStore

    options = WeightOnlyOptions(bits=bits, block_size=32)
    memory, details = quantize_weight_only(_tied_lm()[0], options, tied=True)
    src = tmp_path / "src" / "model.onnx"
    src.parent.mkdir()
    save_onnx(_tied_lm()[0], src, external=True)
    out = tmp_path / "out" / "model.onnx"
    out.parent.mkdir()
    stored, stored_details = quantize_stored(onnx.load(str(src), load_external_data=False), src.parent, out, options, tied=True)
    assert stored_details == details
    assert (out.parent / "model.onnx.data").stat().st_size < 40 * 64 * 4  # the float table (10 KiB) is not in it
    WeightStore(out.parent).attach(stored)
    assert [(n.op_type, n.name, list(n.input), list(n.output)) for n in stored.graph.node] == \
        [(n.op_type, n.name, list(n.input), list(n.output)) for n in memory.graph.node]
    a = {t.name: numpy_helper.to_array(t) for t in stored.graph.initializer}
    b = {t.name: numpy_helper.to_array(t) for t in memory.graph.initializer}
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
