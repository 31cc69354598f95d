"""`--dim` as a size, a range or a list of sizes (modelport.dims), and the sizes artifacts are checked at."""

from __future__ import annotations

import numpy as np
import pytest

from modelport.dims import DimSpec, declared, input_dims, parse_dim, parse_dims
from modelport.errors import BadInputError
from modelport.ir import IRModel, Reference, TensorSpec


def test_three_forms_parse_with_their_sample_sizes():
    dims = parse_dims(["batch=1..8", "seq=512,128,256", "channels=3"])
    assert dims == {"batch": DimSpec(1, 8), "seq": DimSpec(128, 512, (128, 256, 512)), "channels": DimSpec(3, 3)}
    assert [d.kind for d in dims.values()] == ["range", "sizes", "fixed"]
    # a batch of two where the range allows; the smallest listed size of two or more; a fixed size as given
    assert [d.sample for d in dims.values()] == [2, 128, 3]
    assert DimSpec(1, 1).sample == 1 and DimSpec(16, 512).sample == 16 and DimSpec(1, 8, (1, 4, 8)).sample == 4
    assert [d.to_dict() for d in dims.values()] == [{"kind": "range", "min": 1, "max": 8},
                                                   {"kind": "sizes", "sizes": [128, 256, 512]}, {"kind": "fixed", "size": 3}]
    assert all(DimSpec.from_dict(d.to_dict()) == d for d in dims.values())


@pytest.mark.parametrize("text", ["batch", "=4", "batch=0", "batch=8..1", "batch=0..4", "batch=a..b", "seq=1,x", "batch=-1", "seq=0,4"])
def test_bad_dims_are_exit_2_naming_the_text(text):
    with pytest.raises(BadInputError) as e:
        parse_dim(text)
    assert e.value.exit_code == 2 and f"--dim '{text}'" in str(e.value)


def test_a_dim_given_twice_is_refused():
    with pytest.raises(BadInputError, match="given twice"):
        parse_dims(["batch=1..4", "batch=2"])


def test_check_sizes_are_the_ends_and_one_between():
    assert DimSpec(1, 8).check_sizes() == [1, 4, 8]
    assert DimSpec(16, 512).check_sizes() == [16, 264, 512]
    assert DimSpec(128, 512, (128, 256, 512)).check_sizes() == [128, 256, 512]
    assert DimSpec(1, 64, (1, 2, 4, 8, 64)).check_sizes() == [1, 4, 64]
    assert DimSpec(1, 2).check_sizes() == [1, 2]
    assert DimSpec(1, 8).check_sizes(cap=4) == [1, 2, 4]


def test_a_range_for_a_dim_no_input_has_is_exit_2_naming_the_dims_there_are():
    inputs = [TensorSpec("x", "float32", ["batch", 3, "height", 32])]
    assert declared({"batch": "1..8", "height": DimSpec(3, 3)}, inputs) == {"batch": DimSpec(1, 8)}
    with pytest.raises(BadInputError) as e:
        declared({"seq": DimSpec(1, 8)}, inputs)
    assert "no input has a dynamic dim 'seq'" in str(e.value) and "batch, height" in str(e.value)


def test_the_python_api_takes_the_cli_texts(tmp_path):
    from modelport.orchestration import ConvertOptions

    o = ConvertOptions(sample_dims={"batch": "1..8", "seq": "128,256", "h": 4})
    assert o.sample_dims == {"batch": 2, "seq": 128, "h": 4}
    assert o.dim_bounds == {"batch": DimSpec(1, 8), "seq": DimSpec(128, 256, (128, 256))}
    o = ConvertOptions(dim_bounds={"batch": "1..4"})
    assert o.sample_dims == {"batch": 2}
    assert ConvertOptions(sample_dims={"batch": 3}, dim_bounds={"batch": "1..4"}).sample_dims == {"batch": 3}
    from modelport.orchestration.request import decide

    with pytest.raises(BadInputError, match=r"batch=16 is outside the sizes declared for it \(1..4\)"):
        decide("zoo:cnn_small", tmp_path / "o", ConvertOptions(sample_dims={"batch": 16}, dim_bounds={"batch": "1..4"}))


def test_input_dims_say_kept_fixed_or_dynamic():
    inputs = [TensorSpec("ids", "int64", ["batch", "seq"]), TensorSpec("x", "float32", [1, "n"])]
    assert input_dims(inputs, {"batch": DimSpec(1, 4)}, {"seq": 8}) == {
        "ids": {"batch": {"kind": "range", "min": 1, "max": 4}, "seq": {"kind": "fixed", "size": 8}},
        "x": {"n": {"kind": "dynamic"}}}


def _ir(batch: int, width: int, bounds: dict) -> IRModel:
    x = np.zeros((batch, width), np.float32)
    return IRModel(model=None, inputs=[TensorSpec("x", "float32", ["batch", width])],
                   outputs=[TensorSpec("y", "float32", ["batch", width])], reference=Reference({"x": x}, {"y": x}),
                   sample_dims={"batch": batch}, dim_bounds=bounds)


def test_the_largest_size_is_capped_by_the_memory_estimate_and_said():
    from modelport.validation.dim_sizes import points

    ir = _ir(2, 1024, {"batch": DimSpec(1, 4096)})  # 2 x 1024 floats in and out: 16 KiB; at 4096 rows 32 MiB
    at, note = points(ir, ir.dim_bounds)
    assert at == [{"batch": 1}, {"batch": 2048}, {"batch": 4096}] and note == {}
    at, note = points(ir, ir.dim_bounds, cap=8 << 20)  # halved until the estimate fits: 1024 rows, 8 MiB
    assert at == [{"batch": 1}, {"batch": 512}, {"batch": 1024}]
    assert note == {"capped_at": {"batch": 1024}, "largest": {"batch": 4096}, "estimate_bytes": 32 << 20, "cap_bytes": 8 << 20}


def test_an_artifact_in_another_layout_is_not_fed_the_contract_s():
    """A channels-last TFLite file takes [n, 8, 8, 3] where the contract has [batch, 3, 8, 8]: the
    sizes are then not checked (said in the entry), where a cut to other sizes is still its layout."""
    from pathlib import Path

    from modelport.artifact import Artifact
    from modelport.validation.dim_sizes import other_layout

    zeros = np.zeros
    ir = IRModel(model=None, inputs=[TensorSpec("x", "float32", ["batch", 3, 8, 8])],
                 outputs=[TensorSpec("y", "float32", ["batch", 4])],
                 reference=Reference({"x": zeros((2, 3, 8, 8))}, {"y": zeros((2, 4))}))
    art = Artifact("tflite", "tflite", Path("model.tflite"), [],
                   reference=Reference({"x": zeros((2, 8, 8, 3))}, {"y": zeros((2, 4))}))
    assert other_layout(art, ir) == ["x"]
    art.reference = Reference({"x": zeros((1, 3, 8, 8))}, {"y": zeros((1, 4))})
    assert other_layout(art, ir) == []
    art.reference = None
    assert other_layout(art, ir) == []
