"""Sample inputs and the check that a reference depends on its input."""

from __future__ import annotations

import numpy as np

from modelport.ir import TensorSpec
from modelport.reference.samples import make_inputs, output_varies, reference_varies

SPECS = [TensorSpec("x", "float32", ["batch", 4]), TensorSpec("ids", "int64", ["batch", 3], value_range=[0, 50])]


def test_second_set_differs_and_the_first_is_unchanged():
    first = make_inputs(SPECS, {"batch": 2}, seed=3)
    again = make_inputs(SPECS, {"batch": 2}, seed=3, variant=0)
    second = make_inputs(SPECS, {"batch": 2}, seed=3, variant=1)
    for k in first:
        assert np.array_equal(first[k], again[k])
        assert not np.array_equal(first[k], second[k])
    # the reference set is what it was before the second set existed
    rng = np.random.default_rng([3, __import__("zlib").crc32(b"x")])
    assert np.array_equal(first["x"], rng.standard_normal((2, 4)).astype(np.float32))


def test_output_varies_rules():
    a = np.arange(4, dtype=np.float32)
    assert output_varies(a, a + 1) is True
    assert output_varies(a, a.copy()) is False
    assert output_varies(np.full(3, np.nan, np.float32), np.full(3, 1.0, np.float32)) is False  # all NaN
    assert output_varies(np.array([np.inf, -np.inf]), np.array([1.0, 2.0])) is False
    assert output_varies(np.array([1, 2]), np.array([1, 2])) is None  # an argmax that agrees proves nothing either way
    assert output_varies(np.array([1, 2]), np.array([2, 2])) is True
    assert output_varies(np.zeros((0, 3), np.float32), np.zeros((0, 3), np.float32)) is True


def test_reference_varies_runs_the_second_set():
    feeds = make_inputs(SPECS, {"batch": 2}, seed=0)

    def run(f):
        return {"y": f["x"] * 2, "c": np.ones(3, np.float32)}

    assert reference_varies(run, SPECS, run(feeds), {"batch": 2}, seed=0) == {"y": True, "c": False}

    def broken(f):
        raise RuntimeError("data-dependent failure")

    assert reference_varies(broken, SPECS, run(feeds), {"batch": 2}, seed=0) == {"y": None, "c": None}


# --- sample data the user chooses: --data inputs.npz and --value NAME=V ---------------------------

def _control_input_model(path):
    """y = sum(x) when sr == 16000, else a Gather whose index is out of range (fails at run time),
    the way a VAD model's `If` on its sample-rate input fails on a random value."""
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    sr = helper.make_tensor_value_info("sr", TensorProto.INT64, [])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    then_branch = helper.make_graph(
        [helper.make_node("ReduceSum", ["x", "axes"], ["s"], keepdims=0)], "ok", [],
        [helper.make_tensor_value_info("s", TensorProto.FLOAT, [1])],
        [helper.make_tensor("axes", TensorProto.INT64, [1], [1])])
    else_branch = helper.make_graph(
        [helper.make_node("Gather", ["x", "far"], ["g"], axis=1)], "bad", [],
        [helper.make_tensor_value_info("g", TensorProto.FLOAT, [1])],
        [helper.make_tensor("far", TensorProto.INT64, [], [10])])
    graph = helper.make_graph(
        [helper.make_node("Equal", ["sr", "rate"], ["is_16k"]),
         helper.make_node("If", ["is_16k"], ["y"], then_branch=then_branch, else_branch=else_branch)],
        "vad_like", [x, sr], [y], [helper.make_tensor("rate", TensorProto.INT64, [], [16000])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def test_given_inputs_replace_random_ones_in_both_sample_sets():
    given = {"ids": np.asarray(7), "x": np.ones((3, 4), np.float32)}
    first = make_inputs(SPECS, {"batch": 2}, given=given)
    second = make_inputs(SPECS, {"batch": 2}, variant=1, given=given)
    assert np.array_equal(first["x"], np.ones((3, 4), np.float32))  # used as given: its batch of 3 ...
    assert first["ids"].shape == (3, 3) and (first["ids"] == 7).all()  # ... binds `batch` for the others
    assert np.array_equal(first["ids"], second["ids"]) and np.array_equal(first["x"], second["x"])
    # a reference that only reads the pinned input is not flagged as ignoring its input
    varies = reference_varies(lambda f: {"y": f["ids"].astype(np.float32) + f["x"][:, :1]}, SPECS,
                              {"y": first["ids"].astype(np.float32) + first["x"][:, :1]}, {"batch": 2}, given=given)
    assert varies == {"y": None}  # every input pinned: no second distinct set, so undecided (not "ignores its input")
    pinned = {"ids": given["ids"]}
    first = make_inputs(SPECS, {"batch": 2}, given=pinned)
    varies = reference_varies(lambda f: {"y": f["x"].sum(1)}, SPECS, {"y": first["x"].sum(1)}, {"batch": 2}, given=pinned)
    assert varies == {"y": True}  # x random in both sets


def test_control_input_reference_failure_is_exit_2_naming_it(cli, cli_proc, tmp_path):
    model = _control_input_model(tmp_path / "vad.onnx")
    r = cli("convert", model, "-o", tmp_path / "out")
    assert r.exit_code == 2, r
    assert "reference run failed" in r.stderr and "['sr']" in r.stderr and "vad.onnx" in r.stderr
    assert "--value NAME=V" in r.stderr and "--data" in r.stderr
    p = cli_proc("convert", model, "-o", tmp_path / "out")  # a real process: onnxruntime's own log lines stay out
    assert p.exit_code == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_value_pins_a_control_input(cli, tmp_path):
    model = _control_input_model(tmp_path / "vad.onnx")
    r = cli("convert", model, "--value", "sr=16000", "-o", tmp_path / "out", "--json")
    assert r.exit_code == 0, r
    report = r.json()
    assert report["status"] == "ok" and report["contract"]["given_inputs"] == ["sr"]
    assert [o["reference_varies"] for o in report["contract"]["outputs"]] == [True]  # x stays random


def test_data_file_pins_a_control_input_and_is_checked(cli, tmp_path):
    model = _control_input_model(tmp_path / "vad.onnx")
    data = tmp_path / "in.npz"
    np.savez(data, sr=np.asarray(16000, np.int64), x=np.arange(4, dtype=np.float32).reshape(1, 4))
    r = cli("convert", model, "--data", data, "--strict", "-o", tmp_path / "out")
    assert r.exit_code == 0, r  # every input pinned: undecided, not "ignores its input" (exit 4 under --strict)
    for name, bad, why in (("missing", {"sr": np.asarray(16000), "rate_hz": np.asarray(1)}, "rate_hz"),
                           ("shape", {"x": np.zeros((1, 5), np.float32)}, "'x' has shape [1, 5]"),
                           ("dtype", {"x": np.zeros((1, 4), np.float64)}, "'x' is float64")):
        np.savez(tmp_path / f"{name}.npz", **bad)
        r = cli("convert", model, "--data", tmp_path / f"{name}.npz", "--value", "sr=16000", "-o", tmp_path / name)
        assert r.exit_code == 2 and why in r.stderr, (name, r)


def test_value_for_an_unknown_input_lists_the_models_inputs(cli, tmp_path):
    model = _control_input_model(tmp_path / "vad.onnx")
    r = cli("convert", model, "--value", "rate=16000", "-o", tmp_path / "out")
    assert r.exit_code == 2 and "'rate'" in r.stderr and "['x', 'sr']" in r.stderr, r
    r = cli("convert", model, "--value", "sr=fast", "-o", tmp_path / "out")
    assert r.exit_code == 2 and "bad --value 'sr=fast'" in r.stderr, r


def test_stacked_samples_feed_the_reference_and_the_second_set():
    stack = np.arange(2 * 1 * 4, dtype=np.float32).reshape(2, 1, 4)  # two samples of x[1, 4]
    specs = [TensorSpec("x", "float32", [1, 4])]
    first = make_inputs(specs, given={"x": stack})
    second = make_inputs(specs, variant=1, given={"x": stack})
    assert np.array_equal(first["x"], stack[0]) and np.array_equal(second["x"], stack[1])
    assert reference_varies(lambda f: {"y": f["x"] * 2}, specs, {"y": first["x"] * 2}, given={"x": stack}) == {"y": True}


# --- symbolic dims the model only takes at some sizes (a detector's multiples of 32) --------------

def _strided_model(path, *, metadata: dict | None = None, fixed_size: int | None = None):
    """A YOLO-like neck: the input concatenated with its 1/32 average, upsampled back. It runs only
    where height and width are multiples of 32 (the default sample size 2 gives onnxruntime's
    Concat error). With `fixed_size` the input is concatenated with a constant of that height and
    width instead, so it runs at that size alone."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    if fixed_size:
        const = numpy_helper.from_array(np.zeros((1, 1, fixed_size, fixed_size), np.float32), "c")
        nodes, init = [helper.make_node("Concat", ["x", "c"], ["y"], axis=1)], [const]
    else:
        nodes = [helper.make_node("AveragePool", ["x"], ["d"], kernel_shape=[32, 32], strides=[32, 32]),
                 helper.make_node("Resize", ["d", "", "scales"], ["u"], mode="nearest"),
                 helper.make_node("Concat", ["x", "u"], ["y"], axis=1)]
        init = [numpy_helper.from_array(np.array([1, 1, 32, 32], np.float32), "scales")]
    graph = helper.make_graph(nodes, "neck", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "height", "width"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, None, "height", "width"])], init)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    if metadata:
        helper.set_model_props(model, metadata)
    onnx.save(model, path)
    return path


def test_symbolic_dims_retry_a_common_size_or_the_metadata_one_and_say_so(cli, tmp_path):
    for name, metadata, want, source in (("plain", None, {"height": 32, "width": 32}, "a common size"),
                                         ("ultralytics", {"imgsz": "[64, 96]", "stride": "32"}, {"height": 64, "width": 96},
                                          "the model's metadata imgsz=[64, 96]")):
        model = _strided_model(tmp_path / f"{name}.onnx", metadata=metadata)
        r = cli("convert", model, "-o", tmp_path / name, "--json")
        assert r.exit_code == 0, (name, r)  # was exit 2: onnxruntime's Concat error at height=width=2
        report = r.json()
        assert report["contract"]["sample_dims"] == want
        (warning,) = [w for w in report["warnings"] if "reference run failed" in w]
        assert "default sample size (height=2, width=2): Concat: " in warning
        assert f"it ran with {', '.join(f'{k}={v}' for k, v in want.items())} ({source})" in warning and "--dim" in warning
    r = cli("convert", tmp_path / "plain.onnx", "--dim", "height=64", "--dim", "width=64", "-o", tmp_path / "sized", "--json")
    assert r.exit_code == 0 and r.json()["warnings"] == [] and r.json()["contract"]["sample_dims"] == {"height": 64, "width": 64}


def test_symbolic_dims_no_size_fits_is_exit_2_naming_each_dim_and_the_flag(cli, tmp_path):
    model = _strided_model(tmp_path / "odd.onnx", fixed_size=100)
    r = cli("convert", model, "-o", tmp_path / "out")
    assert r.exit_code == 2 and not (tmp_path / "out").exists(), r
    err = r.stderr.strip()
    assert len(err.splitlines()) == 1 and "odd.onnx" in err and "Concat: " in err
    assert "symbolic dims sampled at height=2, width=2 (also tried 32, 64, 224, 640)" in err
    assert "--dim height=640 --dim width=640" in err
    assert cli("convert", model, "--dim", "height=100", "--dim", "width=100", "-o", tmp_path / "out").exit_code == 0


# --- structured sets at the magnitudes real inputs take ----------------------------------------------

def test_the_sweep_sets_floats_with_no_range_to_full_mantissa_constants_and_keeps_everything_else():
    """Constant frames at the floors preprocessing makes and at seeded constants, each with a full
    float32 mantissa (float16 inputs too, rounded to their dtype and finite); a declared range, an
    integer input and a size (`keep`) keep the first set's values."""
    from modelport.reference.sample_sets import BANDS, DB_FLOOR, LOG_FLOOR, SWEEP_KINDS, sample_sets, sweep_value

    specs = [TensorSpec("frame", "float32", [2, 384]), TensorSpec("half", "float16", [2, 8]),
             TensorSpec("image", "float32", [1, 3, 4, 4], "NCHW", value_range=[0, 1]),
             TensorSpec("ids", "int64", [2, 3]), TensorSpec("scales", "float32", [4])]
    first = make_inputs(specs)
    sets = dict(sample_sets(specs, first, keep={"scales"}))
    frames = [k for k in SWEEP_KINDS if k != "grey-raw"]  # no input here is an image without a range
    assert list(sets) == ["random-2", "random-small", "zeros", "constant", "low", "high", "grey", *frames]
    assert np.float32(DB_FLOOR) == np.float32(20 * np.log10(np.finfo(np.float32).eps)) and round(DB_FLOOR, 2) == -138.47
    assert round(LOG_FLOOR, 3) == -15.942
    for kind in frames:
        value = np.float32(sweep_value(kind))
        feeds = sets[kind]
        assert (feeds["frame"] == value).all() and feeds["frame"].dtype == np.float32
        # a full mantissa: neither its square nor the sum of the frame is exact in float32
        assert np.float64(value) ** 2 != np.float64(value * value)
        assert (feeds["half"] == np.float16(value)).all() and np.isfinite(feeds["half"]).all()
        for name in ("image", "ids", "scales"):
            np.testing.assert_array_equal(feeds[name], first[name])
    for kind, (lo, hi) in BANDS.items():
        assert lo <= sweep_value(kind) < hi and int(np.float32(sweep_value(kind)).view(np.uint32)) & 1
        assert sweep_value(kind, seed=0) != sweep_value(kind, seed=1) and sweep_value(kind, 3) == sweep_value(kind, 3)
    for kind in ("zeros", "constant", "grey"):  # a size keeps its values in every structured set
        np.testing.assert_array_equal(sets[kind]["scales"], first["scales"])
    # an image's letterbox grey inside its declared range; a frame that is not an image takes none
    assert np.allclose(sets["grey"]["image"], 114 / 255) and np.array_equal(sets["grey"]["frame"], first["frame"])


def test_an_image_with_no_declared_range_is_judged_at_the_letterbox_grey_of_0_1_frames():
    from modelport.reference.sample_sets import sample_sets

    specs = [TensorSpec("images", "float32", [1, 3, 8, 8]), TensorSpec("nhwc", "float32", [1, 8, 8, 3]),
             TensorSpec("features", "float32", [1, 16, 8, 8])]
    first = make_inputs(specs)
    sets = dict(sample_sets(specs, first))
    grey, raw = sets["grey"], sets["grey-raw"]
    assert (grey["images"] == np.float32(114 / 255)).all() and (grey["nhwc"] == np.float32(114 / 255)).all()
    assert (raw["images"] == 114).all() and (raw["nhwc"] == 114).all()
    np.testing.assert_array_equal(grey["features"], first["features"])
    np.testing.assert_array_equal(raw["features"], first["features"])


def test_an_8_bit_image_is_also_judged_at_its_letterbox_grey():
    from modelport.reference.sample_sets import sample_sets

    specs = [TensorSpec("pixels", "uint8", [1, 8, 8, 3], "NHWC"), TensorSpec("q", "int8", [1, 3, 8, 8], "NCHW")]
    first = make_inputs(specs)
    grey = dict(sample_sets(specs, first))["grey"]
    assert (grey["pixels"] == 114).all() and (grey["q"] == 114 - 128).all()
