"""Every hop judged on several sample sets: other seeds and scales, and structured inputs (all-zeros,
a constant, the ends of the input's range) that random data never reach."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from modelport.errors import ValidationError
from modelport.ir import Preprocess, Reference, Sample, TensorSpec
from modelport.reference.sample_sets import reference_samples, sample_sets
from modelport.reference.samples import make_inputs
from modelport.runtimes.base import Runner
from modelport.validation import Tolerance, check
from modelport.validation.compare import compare_arrays


def _log_energy(path, *, eps: float | None):
    """y = log(x*x + eps): finite on silence with an epsilon, -inf without it (what a rewrite that
    folds the epsilon away does to an audio front end)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 64])
    nodes = [helper.make_node("Mul", ["x", "x"], ["sq"])]
    inits = []
    if eps is not None:
        inits.append(helper.make_tensor("eps", TensorProto.FLOAT, [], [eps]))
        nodes.append(helper.make_node("Add", ["sq", "eps"], ["e"]))
    nodes.append(helper.make_node("Log", ["e" if eps is not None else "sq"], ["y"]))
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y], inits), opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_sets_cover_seeds_scales_and_structured_inputs():
    image = TensorSpec("image", "float32", ["batch", 3, 4, 4], "NCHW",
                       Preprocess(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]))
    pcm = TensorSpec("pcm", "int16", ["batch", 8])
    ids = TensorSpec("ids", "int64", ["batch", 5], value_range=[0, 100])
    mask = TensorSpec("mask", "uint8", ["batch", 5])
    specs = [image, pcm, ids, mask]
    first = make_inputs(specs, {"batch": 1})
    sets = dict(sample_sets(specs, first, {"batch": 1}))
    # no sweep: every float input has a known range
    assert list(sets) == ["random-2", "random-small", "zeros", "constant", "low", "high", "grey"]
    # a black, a white and a letterbox-grey image as the model sees them, channel by channel
    black = (0 - np.array([0.485, 0.456, 0.406])) / np.array([0.229, 0.224, 0.225])
    white = (1 - np.array([0.485, 0.456, 0.406])) / np.array([0.229, 0.224, 0.225])
    grey = (114 / 255 - np.array([0.485, 0.456, 0.406])) / np.array([0.229, 0.224, 0.225])
    np.testing.assert_allclose(sets["low"]["image"][0, :, 0, 0], black, rtol=1e-6)
    np.testing.assert_allclose(sets["high"]["image"][0, :, 2, 3], white, rtol=1e-6)
    np.testing.assert_allclose(sets["grey"]["image"][0, :, 1, 1], grey, rtol=1e-6)
    np.testing.assert_array_equal(sets["grey"]["mask"], first["mask"])  # 8-bit, but not an image
    assert not sets["zeros"]["image"].any()
    # quiet: 1/100 of the range above its low end
    small = sets["random-small"]["image"]
    assert small.min() >= black.min() - 1e-6 and small.max() <= black.min() + 0.01 * (white.max() - black.min()) + 1e-6
    # 8-bit data takes its whole range; token ids their declared one; other integers keep the first set's values
    assert sets["low"]["mask"].min() == 0 and sets["high"]["mask"].max() == 255
    assert (sets["low"]["ids"] == 0).all() and (sets["high"]["ids"] == 99).all()
    np.testing.assert_array_equal(sets["zeros"]["ids"], first["ids"])
    np.testing.assert_array_equal(sets["high"]["pcm"], first["pcm"])
    for feeds in sets.values():
        assert {k: v.dtype for k, v in feeds.items()} == {k: v.dtype for k, v in first.items()}


def test_sets_keep_pinned_inputs_and_drop_sets_equal_to_the_first():
    specs = [TensorSpec("x", "float32", [1, 4]), TensorSpec("sr", "int64", [])]
    given = {"sr": np.asarray(16000)}
    first = make_inputs(specs, given=given)
    sets = dict(sample_sets(specs, first, given=given))
    assert all(int(f["sr"]) == 16000 for f in sets.values())
    assert "low" not in sets and "high" not in sets  # no range known for x, and sr is pinned
    only_ids = [TensorSpec("ids", "int64", [1, 3])]
    assert [k for k, _ in sample_sets(only_ids, make_inputs(only_ids))] == ["random-2", "random-3"]
    assert sample_sets(specs, first, given=given, randoms=1, structured=False) == []


def test_source_failure_on_a_set_skips_it_and_says_so():
    specs = [TensorSpec("x", "float32", [2, 3])]
    first = make_inputs(specs)

    def run(feeds):
        if not feeds["x"].any():
            raise ZeroDivisionError("silence")
        return {"y": feeds["x"] * 2}

    varies, extra, skipped = reference_samples(run, specs, first, run(first))
    assert varies == {"y": True}
    assert [s.kind for s in extra] == ["random-2", "random-small", "constant", "floor-db", "floor-log", "full-mantissa",
                                       "full-mantissa-large"]
    assert skipped == ["zeros: ZeroDivisionError: silence"]


def test_reference_keeps_its_sets_on_disk(tmp_path):
    ref = Reference({"x": np.ones(2)}, {"y": np.ones(2)}, "p",
                    extra=[Sample("zeros", {"x": np.zeros(2)}, {"y": np.zeros(2)})])
    ref.save(tmp_path / "r.npz")
    back = Reference.load(tmp_path / "r.npz")
    assert back.kinds() == ["random", "zeros"]
    np.testing.assert_array_equal(back.extra[0].inputs["x"], np.zeros(2))


class _Runner(Runner):
    def __init__(self, fn):
        self.fn = fn

    def run(self, feeds):
        return {"y": self.fn(feeds["x"])}


def test_check_judges_every_set_and_names_the_worst():
    x = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)
    ref = Reference({"x": x}, {"y": np.exp(x)},
                    extra=[Sample("zeros", {"x": np.zeros_like(x)}, {"y": np.ones_like(x)})])
    good = check(_Runner(np.exp), ref, Tolerance(), "hop")
    assert good.ok and [s["kind"] for s in good.samples] == ["random", "zeros"]
    # right on random data, NaN on silence: the hop fails and says on which sample
    bad = check(_Runner(lambda v: np.where(v == 0, np.nan, np.exp(v))), ref, Tolerance(), "hop")
    assert not bad.ok
    assert bad.outputs[0].sample == "zeros" and bad.outputs[0].nan == 16
    assert "on the 'zeros' sample" in bad.outputs[0].reason and "[zeros]" in bad.summary()
    assert bad.to_dict()["samples"][0]["ok"] and not bad.to_dict()["samples"][1]["ok"]


def test_cosine_is_not_judged_on_an_output_that_is_zero():
    zero = np.zeros(64, np.float32)
    noise = np.full(64, 1e-7, np.float32)
    assert compare_arrays("y", zero, noise, Tolerance()).ok  # within atol: silence in, silence out
    assert not compare_arrays("y", zero, noise + 1e-3, Tolerance()).ok  # outside atol still fails
    assert not compare_arrays("y", np.ones(64), -np.ones(64), Tolerance(10, 10, 0.999)).ok


def test_validate_fails_a_model_that_turns_silence_into_inf(tmp_path):
    """Random inputs alone pass a log whose epsilon was dropped; the all-zeros set does not."""
    from modelport.orchestration.validate import validate_models

    source = _log_energy(tmp_path / "source.onnx", eps=1e-12)
    rewritten = _log_energy(tmp_path / "rewritten.onnx", eps=None)
    report = validate_models(source, rewritten, sampling={"randoms": 3, "structured": False})
    assert report["parity"][0]["ok"]
    with pytest.raises(ValidationError) as e:
        validate_models(source, rewritten)
    assert "zeros" in e.value.reason and "Inf" in e.value.reason
    assert e.value.parity["outputs"][0]["sample"] == "zeros"


def test_validate_cli_exit_4_on_silence(cli, tmp_path):
    source = _log_energy(tmp_path / "source.onnx", eps=1e-12)
    rewritten = _log_energy(tmp_path / "rewritten.onnx", eps=None)
    r = cli("validate", source, rewritten, "--json")
    assert r.exit_code == 4, r
    kinds = [s["kind"] for s in r.json()["parity"][0]["samples"]]
    assert kinds[:3] == ["random", "random-2", "random-small"] and "zeros" in kinds
    assert cli("validate", source, rewritten, "--no-structured-samples").exit_code == 0


def test_an_attention_mask_without_a_range_is_sampled_as_ones():
    specs = [TensorSpec("input_ids", "int64", [1, 6]), TensorSpec("attention_mask", "int64", [1, 6])]
    for variant in (0, 1, 2):
        assert (make_inputs(specs, variant=variant)["attention_mask"] == 1).all()
    assert make_inputs(specs)["input_ids"].max() > 1


def _frame_norm(path, *, one_pass: bool, width: int = 384):
    """y = (x - E[x]) / sqrt(Var[x] + 1e-5) over a frame: Var as E[(x - E[x])²] (two passes), or
    as E[x²] - E[x]² (one pass), which cancels at a large mean: NaN where it rounds below -eps."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", width])
    nodes = [helper.make_node("ReduceMean", ["x", "axes"], ["m"], keepdims=1), helper.make_node("Sub", ["x", "m"], ["d"])]
    if one_pass:
        nodes += [helper.make_node("Mul", ["x", "x"], ["sq"]), helper.make_node("ReduceMean", ["sq", "axes"], ["m2"], keepdims=1),
                  helper.make_node("Mul", ["m", "m"], ["mm"]), helper.make_node("Sub", ["m2", "mm"], ["var"])]
    else:
        nodes += [helper.make_node("Mul", ["d", "d"], ["dd"]), helper.make_node("ReduceMean", ["dd", "axes"], ["var"], keepdims=1)]
    nodes += [helper.make_node("Add", ["var", "eps"], ["ve"]), helper.make_node("Sqrt", ["ve"], ["s"]),
              helper.make_node("Div", ["d", "s"], ["y"])]
    inits = [helper.make_tensor("axes", TensorProto.INT64, [1], [-1]), helper.make_tensor("eps", TensorProto.FLOAT, [], [1e-5])]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y], inits), opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_validate_fails_a_one_pass_variance_at_a_large_mean(cli, tmp_path):
    """Right on random data, silence (zeros) and 1.0, where E[x²] - E[x]² is exact or well
    conditioned; NaN at the log floor and the seeded constants, where the square of a full mantissa
    rounds (off by 1e-2 at the dB floor): the sweep's sets fail the hop."""
    source = _frame_norm(tmp_path / "two_pass.onnx", one_pass=False)
    rewritten = _frame_norm(tmp_path / "one_pass.onnx", one_pass=True)
    r = cli("validate", source, rewritten, "--json")
    assert r.exit_code == 4, r
    parity = r.json()["parity"][0]
    rows = {s["kind"]: s for s in parity["samples"]}
    assert list(rows) == ["random", "random-2", "random-small", "zeros", "constant", "floor-db", "floor-log",
                          "full-mantissa", "full-mantissa-large"]
    assert all(rows[k]["ok"] for k in ("random", "random-2", "random-small", "zeros", "constant"))
    assert not any(rows[k]["ok"] for k in ("floor-log", "full-mantissa", "full-mantissa-large"))
    assert all(rows[k]["outputs"][0]["nan"] > 0 for k in ("floor-log", "full-mantissa", "full-mantissa-large"))
    assert rows["floor-db"]["outputs"][0]["max_abs"] > 1e-2  # inside the sweep's coherent-sum tolerance there
    assert not any("ill_conditioned" in row for row in rows.values())  # the two-pass source is steady there
    assert parity["outputs"][0]["sample"] == "floor-log"
    assert "[floor-log]" in r.json()["error"]["message"]
    assert cli("validate", source, rewritten, "--no-structured-samples").exit_code == 0


def _scaled_by_count(path, *, clip: int | None):
    """y = x * k, k an int64 input that only arithmetic reads (no role the graph shows); `clip`
    caps k first, which random integers above it expose."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])
    k = helper.make_tensor_value_info("k", TensorProto.INT64, [2, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])
    nodes, inits, src = [], [], "k"
    if clip is not None:
        nodes.append(helper.make_node("Min", ["k", "cap"], ["kc"]))
        inits.append(helper.make_tensor("cap", TensorProto.INT64, [], [clip]))
        src = "kc"
    nodes += [helper.make_node("Cast", [src], ["kf"], to=TensorProto.FLOAT), helper.make_node("Mul", ["x", "kf"], ["y"])]
    model = helper.make_model(helper.make_graph(nodes, "g", [x, k], [y], inits), opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_a_failure_on_random_integers_names_the_input_and_the_fix(tmp_path):
    from modelport.orchestration.validate import validate_models

    source = _scaled_by_count(tmp_path / "a.onnx", clip=None)
    capped = _scaled_by_count(tmp_path / "b.onnx", clip=4)
    with pytest.raises(ValidationError) as e:
        validate_models(source, capped)
    assert "input(s) k got random integers" in e.value.hint and "--value NAME=V" in e.value.hint
    assert validate_models(source, capped, values=["k=3"])["parity"][0]["ok"]
