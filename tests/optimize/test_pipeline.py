from unittest import mock

import numpy as np
import pytest
from onnx import helper, numpy_helper

from modelport.errors import ValidationError
from modelport.optimize import Pass, PassResult, get_pass
from modelport.optimize.pipeline import OptimizeOptions, optimize_ir, parse_budget, run_passes
from tests.alone import run_alone
from tests.conftest import check_options_class
from tests.optimize.conftest import make_ir, ops


class BreakWeights(Pass):
    """Deliberately wrong: doubles every initializer."""

    name = "break"

    def apply(self, ir):
        out = ir.clone()
        for t in out.model.graph.initializer:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t) * 2, t.name))
        return PassResult(out, True)


@pytest.fixture
def mm_ir():
    rng = np.random.default_rng(4)
    return make_ir([helper.make_node("Identity", ["x"], ["xi"]), helper.make_node("MatMul", ["xi", "w"], ["mm"]),
                    helper.make_node("Add", ["mm", "b"], ["y"])],
                   [("x", [2, 8])], [("y", [2, 4])], {"w": rng.standard_normal((8, 4)), "b": rng.standard_normal(4)})


def test_parity_breaking_pass_is_rolled_back(mm_ir):
    out, rows = run_passes(mm_ir, [get_pass("dce"), BreakWeights(), get_pass("fuse")])
    assert [r.status for r in rows] == ["applied", "rolled_back", "applied"]
    assert "parity" in rows[1].reason and rows[1].parity["ok"] is False
    assert ops(out) == ["Gemm"]
    w = numpy_helper.to_array(next(t for t in out.model.graph.initializer if t.name == "w"))
    np.testing.assert_array_equal(w, numpy_helper.to_array(mm_ir.model.graph.initializer[0]))
    assert rows[0].nodes_before == 3 and rows[0].nodes_after == 2 and rows[0].seconds >= 0


def test_each_pass_row_carries_the_peak_rss_of_the_process_tree_while_it_ran(mm_ir):
    """The passes' rows are the report's only rows for the optimisation stage: a pass that holds
    much (onnxruntime's fusions on a large model) sets the run's `peak_rss` through its own row."""
    import time

    import psutil

    class Hog(Pass):
        name = "hog"

        def apply(self, ir):
            block = np.ones(300 << 20, dtype=np.uint8)
            time.sleep(0.5)  # sampled while held
            del block
            return PassResult(ir, False)

    before = psutil.Process().memory_info().rss
    _, rows = run_passes(mm_ir, [get_pass("dce"), Hog()])
    docs = [r.to_dict() for r in rows]
    assert all(isinstance(d.get("peak_rss"), int) and d["peak_rss"] > 0 for d in docs), docs
    assert docs[1]["peak_rss"] >= before + (250 << 20), (docs[1]["peak_rss"], before)


def test_strict_fails_with_validation_error(mm_ir):
    with pytest.raises(ValidationError) as e:
        run_passes(mm_ir, [BreakWeights()], strict=True)
    assert e.value.exit_code == 4 and e.value.rows[0].status == "rolled_back"


def test_failing_pass_rolled_back(mm_ir):
    class Crash(Pass):
        name = "crash"

        def apply(self, ir):
            raise RuntimeError("boom")

    out, rows = run_passes(mm_ir, [Crash()])
    assert out is mm_ir and rows[0].status == "rolled_back" and "boom" in rows[0].reason


def test_levels_and_budget(mm_ir):
    out, rows, sel = optimize_ir(mm_ir, OptimizeOptions(level="basic"))
    assert [r["pass"] for r in rows] == ["shape", "fold", "dce", "cleanup"] and sel is None
    t = parse_budget("cosine>=0.995,max_abs<=0.01")
    assert t.min_cosine == 0.995 and t.atol == 0.01
    from modelport.errors import BadInputError

    with pytest.raises(BadInputError):
        parse_budget("speed>=2")
    with pytest.raises(BadInputError):
        OptimizeOptions(level="turbo")


def test_over_protobuf_limit_goes_through_every_pass(tmp_path, cli):
    """External data in, external data out, with the protobuf limit lowered to 4 KiB."""
    import onnx

    rng = np.random.default_rng(6)
    w = numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(64).astype(np.float32), "b")
    g = helper.make_graph([helper.make_node("Identity", ["x"], ["xi"]), helper.make_node("MatMul", ["xi", "w"], ["mm"]),
                           helper.make_node("Add", ["mm", "b"], ["a"]), helper.make_node("Relu", ["a"], ["y"])], "big",
                          [helper.make_tensor_value_info("x", 1, ["batch", 64])], [helper.make_tensor_value_info("y", 1, ["batch", 64])], [w, b])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    src = tmp_path / "src"
    src.mkdir()
    onnx.save(m, str(src / "big.onnx"), save_as_external_data=True, location="big.onnx.data", size_threshold=0)
    with mock.patch("onnx.checker.MAXIMUM_PROTOBUF", 4096):
        r = cli("optimize", src / "big.onnx", "-o", tmp_path / "out", "--level", "all", "--json")
    assert r.exit_code == 0, r
    rep = r.json()
    statuses = {s["pass"]: s["status"] for s in rep["stages"] if "pass" in s}
    assert "applied" in (statuses["fold"], statuses["dce"]) and statuses["fuse"] == "applied" and statuses["simplify"] == "skipped"
    assert (tmp_path / "out" / "model.onnx.data").is_file()
    assert rep["parity"][-1]["ok"]


def test_options_are_checked_once_here():
    """With the CLI's messages: the CLI builds this class before any work."""
    check_options_class(OptimizeOptions, [
        ({"level": "max"}, "unknown optimisation level 'max'; known: none, basic, extended, all, auto"),
        ({"int8_mode": "semi"}, "unknown INT8 mode 'semi'; known: dynamic, static"),
        ({"calibration_method": "mean"}, "unknown calibration method 'mean'; known: minmax, entropy, percentile, distribution"),
    ], given={"level": "ALL", "precision": "int8-static", "calibration_method": "Entropy"},
        normalised={"level": "all", "precision": "int8", "int8_mode": "static", "calibration_method": "entropy"})


class DoubleInPlace(Pass):
    """Deliberately impure: doubles the weights of the model it is given and returns it as new."""

    name = "double-in-place"

    def apply(self, ir):
        for t in ir.model.graph.initializer:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t) * 2, t.name))
        return PassResult(ir.clone(), True)


@pytest.mark.parametrize("strict", [False, True])
def test_pass_that_mutates_its_input_fails_the_run_naming_it(mm_ir, strict):
    """A rollback restores the input, so a pass that changed it cannot be rolled back: exit 1, whatever `strict` says."""
    from modelport.errors import PassError, StageError

    with pytest.raises(PassError) as e:
        run_passes(mm_ir, [get_pass("dce"), DoubleInPlace()], strict=strict)
    assert isinstance(e.value, StageError) and e.value.exit_code == 1
    assert e.value.pass_name == "double-in-place" and e.value.before == ["dce"]
    assert str(e.value) == e.value.message
    assert "pass 'double-in-place' mutated the model it was given" in e.value.message and "[dce]" in e.value.message


def test_pass_that_mutates_its_input_and_crashes_is_named_too(mm_ir):
    from modelport.errors import PassError

    class HalfDone(DoubleInPlace):
        name = "half-done"

        def apply(self, ir):
            super().apply(ir)
            raise RuntimeError("gave up halfway")

    with pytest.raises(PassError, match="pass 'half-done' mutated"):
        run_passes(mm_ir, [HalfDone()])


def test_fingerprint_of_a_large_model_hashes_tensors_apart_and_puts_them_back(mm_ir):
    """Above the inline limit (2 GiB models cannot be serialised) each tensor is hashed on its own."""
    from modelport.optimize.pipeline import fingerprint

    model = mm_ir.model
    serial = model.SerializeToString(deterministic=True)
    small, large = fingerprint(model), fingerprint(model, inline_limit=0)
    assert model.SerializeToString(deterministic=True) == serial  # the raw data went back
    assert large == fingerprint(model, inline_limit=0) and len(large) == 64
    w = model.graph.initializer[0]
    w.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(w) + 1, w.name))
    assert fingerprint(model) != small and fingerprint(model, inline_limit=0) != large


def test_static_int8_pass_gets_its_calibration_at_construction():
    from modelport.optimize.pipeline import build_passes

    samples = [{"x": np.zeros((2, 8), np.float32)}]
    opts = OptimizeOptions(level="none", precision="int8", int8_mode="static", calibration="unused.npz")
    (p,) = build_passes(opts, calibration=samples)
    assert p.name == "int8-static" and p.calibration is samples
    (named,) = build_passes(OptimizeOptions(level=None, passes=["int8-static"]), calibration=samples)
    assert named.calibration is samples


class Unsorted(Pass):
    """Deliberately wrong: the same nodes in reverse order, which onnxruntime sorts and runs but no checker accepts."""

    name = "unsorted"

    def apply(self, ir):
        out = ir.clone()
        nodes = list(out.model.graph.node)[::-1]
        del out.model.graph.node[:]
        out.model.graph.node.extend(nodes)
        return PassResult(out, True)


class DropProducer(Pass):
    """Deliberately wrong: removes the node that produces the next node's input."""

    name = "drop-producer"

    def apply(self, ir):
        out = ir.clone()
        del out.model.graph.node[0]
        return PassResult(out, True)


def test_pass_yielding_an_invalid_model_is_rolled_back(mm_ir):
    import onnx

    out, rows = run_passes(mm_ir, [DropProducer(), get_pass("dce")])
    assert [r.status for r in rows] == ["rolled_back", "applied"]
    assert rows[0].reason.startswith("invalid model: ") and "xi" in rows[0].reason and rows[0].parity is None
    assert (rows[0].nodes_after, rows[0].size_after) == (rows[0].nodes_before, rows[0].size_before)
    onnx.checker.check_model(out.model)


def test_pass_yielding_nodes_out_of_order_is_applied_sorted(mm_ir):
    """onnxruntime runs an unsorted graph, other consumers refuse it: the gate sorts the pass's result."""
    import onnx

    out, rows = run_passes(mm_ir, [Unsorted()])
    assert rows[0].status == "applied" and rows[0].parity["ok"]
    onnx.checker.check_model(out.model)
    assert ops(out) == ["Identity", "MatMul", "Add"]


def test_pass_yielding_an_invalid_model_fails_under_strict(mm_ir):
    with pytest.raises(ValidationError) as e:
        run_passes(mm_ir, [DropProducer()], strict=True)
    assert e.value.exit_code == 4 and "produced an invalid model" in e.value.message
    assert e.value.rows[0].status == "rolled_back"


HOLD = """
import sys
import numpy as np, onnx
from onnx import helper, numpy_helper
from modelport.run.memory import give_back, own_peak
from modelport.optimize.pipeline import fingerprint, invalid_model
rng = np.random.default_rng(0)
inits, nodes, prev = [], [], "x"
for i in range(50):  # 50 tensors of 4 MB
    inits.append(numpy_helper.from_array(rng.standard_normal((1024, 1024), dtype=np.float32), f"w{i}"))
    nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"h{i}"]))
    prev = f"h{i}"
x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 1024])
y = helper.make_tensor_value_info(prev, onnx.TensorProto.FLOAT, [1, 1024])
model = helper.make_model(helper.make_graph(nodes, "g", [x], [y], inits), opset_imports=[helper.make_opsetid("", 18)])
del inits
give_back()
before = own_peak()
first = fingerprint(model)
assert invalid_model(model) is None and fingerprint(model) == first
print(own_peak() - before, model.ByteSize())
"""


def test_the_parity_gate_reads_a_large_model_without_a_second_copy():
    """A 210 MB model fingerprinted twice and checked: the high-water mark grows by a few of its
    tensors, not by the model (its serialisation, or clearing and restoring its tensors' bytes,
    would add the model's size: protobuf keeps cleared bytes until the message is freed)."""
    grew, size = map(int, run_alone(HOLD).split())
    assert size > 200e6 and grew < 0.25 * size, (grew, size)
