from __future__ import annotations

import pytest

from modelport.errors import BadInputError
from modelport.resolve.specs import apply_options, arch_args_text, parse_arch_args, parse_dims, parse_input_spec, parse_shape


@pytest.mark.parametrize("text,shape", [
    ("1x3x224x224", [1, 3, 224, 224]), ("1,3,224,224", [1, 3, 224, 224]),
    ("batch,3,224,224", ["batch", 3, 224, 224]), ("[?,16]", ["dim0", 16]),
])
def test_shapes(text, shape):
    assert parse_shape(text) == shape


@pytest.mark.parametrize("text", ["1x3x-2", "1,3,2.5", "1,a b", "0x3"])
def test_bad_shapes(text):
    with pytest.raises(BadInputError, match="bad shape"):
        parse_shape(text)


def test_input_spec_forms():
    s = parse_input_spec("input_ids:batch,seq:int64")
    assert (s.name, s.shape, s.dtype) == ("input_ids", ["batch", "seq"], "int64")
    s = parse_input_spec("serving_default_x:0:1x8")
    assert (s.name, s.shape) == ("serving_default_x:0", [1, 8])
    assert parse_input_spec("x").shape == []


@pytest.mark.parametrize("text", ["sr:scalar:int64", "sr:[]:int64", "sr:():int64", "sr:SCALAR:i64"])
def test_a_scalar_input_is_declared_with_shape_scalar(text):
    """A 0-d input (a sample rate that a TorchScript forward takes as an int): its empty shape is given, not missing."""
    s = parse_input_spec(text)
    assert (s.name, s.shape, s.dtype, s.scalar) == ("sr", [], "int64", True)
    assert not parse_input_spec("sr:int64").scalar and not parse_input_spec("x:0").scalar


def test_options_fold_into_specs():
    specs = apply_options([parse_input_spec("image:1x3x8x8")], layouts=["NCHW"], means=["0.5,0.5,0.5"], stds=["image=0.2,0.2,0.2"], channel_order="bgr")
    s = specs[0]
    assert s.layout == "NCHW" and s.preprocess.mean == [0.5] * 3 and s.preprocess.std == [0.2] * 3 and s.preprocess.channel_order == "BGR"
    specs = apply_options([], input_shapes=["1,3,8,8", "1,4"])
    assert [(s.name, s.shape) for s in specs] == [("#0", [1, 3, 8, 8]), ("#1", [1, 4])]
    with pytest.raises(BadInputError, match="layout"):
        apply_options([], layouts=["NCWH"])
    assert parse_dims(["batch=4"]) == {"batch": 4}
    with pytest.raises(BadInputError):
        parse_dims(["batch=0"])


@pytest.mark.parametrize("text,word", [
    ("x:3,8:float99", "float99"), ("x:float99", "float99"), ("x:batch,8:floatx", "floatx"), ("x:1x8:int3", "int3"),
    ("x:0:float99", "float99"),
])
def test_unknown_dtype_is_named_as_a_dtype(text, word):
    with pytest.raises(BadInputError, match=rf"unknown dtype '{word}'; known: .*float32"):
        parse_input_spec(text)


@pytest.mark.parametrize("text,name,shape", [("x:0", "x:0", []), ("x:0:1,8", "x:0", [1, 8]), ("ids:batch,seq", "ids", ["batch", "seq"])])
def test_tensorflow_names_and_named_dims_are_not_dtypes(text, name, shape):
    s = parse_input_spec(text)
    assert (s.name, s.shape) == (name, shape)


def test_arch_args_are_typed_as_json_scalars():
    args = parse_arch_args(["model=tiny,dim=256,scale=0.5", 'flag=true, norm=null,name="12"'])
    assert args == {"model": "tiny", "dim": 256, "scale": 0.5, "flag": True, "norm": None, "name": "12"}
    assert parse_arch_args(arch_args_text(args)) == args and parse_arch_args([]) == {} == parse_arch_args("")
    for bad in ("model", "=3", "1x=2", "a=1,,b=2", "dim=", "dim=1,dim=2"):
        with pytest.raises(BadInputError, match="bad --arch-args"):
            parse_arch_args(bad)



def test_range_declares_the_values_an_input_takes():
    specs = apply_options([parse_input_spec("mel:1,64,100"), parse_input_spec("gain:1")], ranges=["gain=0,2"])
    assert specs[0].value_range is None and specs[1].value_range == [0.0, 2.0]
    assert apply_options([parse_input_spec("x:1,8")], ranges=["0,2"])[0].value_range == [0.0, 2.0]
    for bad in ("mel=40,-100", "mel=1", "mel=a,b"):
        with pytest.raises(BadInputError, match="--range"):
            apply_options([parse_input_spec("mel:1,64,100")], ranges=[bad])


def test_a_declared_range_replaces_the_sweep_for_that_input(cli, tmp_path):
    """A frame declared to take -100..40 (a log-mel in dB) is judged inside that range: no floor or
    seeded constant beyond it; its random sets are drawn in it and its low/high are the ends."""
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("mel", TensorProto.FLOAT, [1, 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])
    model = helper.make_model(helper.make_graph([helper.make_node("Tanh", ["mel"], ["y"])], "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(tmp_path / "m.onnx"))
    r = cli("convert", tmp_path / "m.onnx", "--range", "mel=-100,40", "-o", tmp_path / "out", "--json")
    assert r.exit_code == 0, r
    kinds = [s["kind"] for s in r.json()["parity"][0]["samples"]]
    assert "low" in kinds and "high" in kinds and not {"floor-db", "floor-log", "full-mantissa"} & set(kinds), kinds
    assert r.json()["contract"]["inputs"][0]["value_range"] == [-100.0, 40.0]
