"""The native TFLite route for PyTorch sources (litert-torch): a tiny CNN and a tiny BERT `.pt2`
converted with parity, the contract's names and 64-bit token inputs kept, dims it fixes recorded,
the reasons of both routes when neither converts, and exit 5 when litert-torch is missing."""

from __future__ import annotations

import json

import numpy as np
import pytest

from modelport.errors import UnsupportedError
from modelport.orchestration import ConvertOptions, convert
from modelport.runtimes.tflite import load_interpreter


@pytest.fixture(scope="module")
def tiny_cnn():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                               torch.nn.Flatten(), torch.nn.Linear(4, 5)).eval()


@pytest.fixture(scope="module")
def native_cnn(tiny_cnn, tmp_path_factory):
    """(output folder, report) of `tiny_cnn` converted by litert-torch with its batch left dynamic."""
    out = tmp_path_factory.mktemp("native") / "out"
    report = convert(tiny_cnn, out, ConvertOptions(targets=["tflite"], inputs=["pixels:batch,3,16,16"], output_names=["logits"],
                                                   route="native"))
    return out, report


@pytest.fixture(scope="module")
def bert_pt2(tmp_path_factory):
    """A random-init `transformers` BERT (2 layers, hidden 32) exported to `.pt2` with dynamic batch
    and sequence dims: the kind of model onnx2tf fails on."""
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    bert = BertModel(BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                intermediate_size=64, max_position_embeddings=64)).eval()

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask):
            out = self.bert(input_ids=input_ids, attention_mask=attention_mask)
            return out.last_hidden_state, out.pooler_output

    ids, mask = torch.randint(0, 100, (2, 8)), torch.ones(2, 8, dtype=torch.int64)
    dims = {0: torch.export.Dim("batch"), 1: torch.export.Dim("seq", max=64)}
    ep = torch.export.export(Encoder().eval(), (ids, mask), dynamic_shapes=(dims, dims))
    path = tmp_path_factory.mktemp("bert") / "bert.pt2"
    torch.export.save(ep, path)
    return path


def _signature_shapes(path) -> dict[str, list[int]]:
    runner = load_interpreter(path).get_signature_runner("serving_default")
    details = {**runner.get_input_details(), **runner.get_output_details()}
    return {name: d["shape_signature"].tolist() for name, d in details.items()}


def test_tiny_cnn_native_keeps_names_and_records_fixed_dims(tiny_cnn, native_cnn):
    import torch

    out, report = native_cnn
    (art,) = report["artifacts"]
    assert (art["route"], art["route_converter"]) == ("native", "litert-torch") and art["converter"].startswith("litert-torch")
    assert art["contract_check"]["fixed_dims"] == {"pixels": {"batch": 1}, "logits": {"batch": 1}}
    assert any("fixes dynamic dims" in w for w in report["warnings"])
    assert report["parity"][-1]["hop"] == "pytorch→tflite (native, end to end)" and report["parity"][-1]["ok"]
    it = load_interpreter(out / "model.tflite")
    assert it.get_signature_list() == {"serving_default": {"inputs": ["pixels"], "outputs": ["logits"]}}
    x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)  # NCHW, as the source takes it
    got = it.get_signature_runner("serving_default")(pixels=x)["logits"]
    with torch.no_grad():
        np.testing.assert_allclose(got, tiny_cnn(torch.from_numpy(x)).numpy(), atol=1e-5)


def test_native_fixes_the_batch_as_declared_or_at_1(tiny_cnn, native_cnn, tmp_path):
    """litert-torch fixes every dim: an undeclared batch at 1 (not the sample's 2, which gave a file
    answering a one-sample call with two rows), a declared one (`--dim batch=3`) as declared, and
    the file's output batch is its input batch."""
    out, report = native_cnn
    assert _signature_shapes(out / "model.tflite") == {"pixels": [1, 3, 16, 16], "logits": [1, 5]}
    assert report["artifacts"][0]["fixed_dims"] == {"pixels": {"batch": 1}, "logits": {"batch": 1}}
    declared = tmp_path / "declared"
    report = convert(tiny_cnn, declared, ConvertOptions(targets=["tflite"], inputs=["pixels:batch,3,16,16"], output_names=["logits"],
                                                        route="native", sample_dims={"batch": 3}))
    assert _signature_shapes(declared / "model.tflite") == {"pixels": [3, 3, 16, 16], "logits": [3, 5]}
    assert report["artifacts"][0]["contract_check"]["fixed_dims"] == {"pixels": {"batch": 3}, "logits": {"batch": 3}}
    assert report["parity"][-1]["ok"]


@pytest.mark.parametrize("shape, dtype, reason", [
    (["batch", 5], "float32", None),
    (["batch", 6], "float32", r"output 'logits' has the shape \[1, 5\]; the contract's is \['batch', 6\]"),
    (["batch", 5, 1], "float32", r"output 'logits' has the shape \[1, 5\]; the contract's is \['batch', 5, 1\]"),
    (["batch", "batch"], "float32", r"fixes dim 'batch' at 1 in 'pixels' and at 5 in 'logits'"),
    (["batch", 5], "float16", r"output 'logits' is float32; the contract's is float16"),
])
def test_contract_check_holds_outputs_to_the_contract(tiny_cnn, native_cnn, shape, dtype, reason):
    """The file's outputs against the contract, before parity (which compares values with a
    reference at the file's own sizes): another fixed size, rank, dtype, or one dim at two sizes is
    exit 4; a dynamic dim the file fixes is listed per tensor."""
    import torch

    from modelport.emitters import Artifact
    from modelport.errors import ValidationError
    from modelport.ir import IRModel, Reference, TensorSpec
    from modelport.validation import tolerance_for
    from modelport.validation.artifact import Judging, validate_artifact

    out, _ = native_cnn
    x = np.random.default_rng(0).standard_normal((1, 3, 16, 16)).astype(np.float32)
    with torch.no_grad():
        y = tiny_cnn(torch.from_numpy(x)).numpy()
    ir = IRModel(model=None, inputs=[TensorSpec("pixels", "float32", ["batch", 3, 16, 16])],
                 outputs=[TensorSpec("logits", dtype, shape)], reference=Reference({"pixels": x}, {"logits": y}))
    art = Artifact(target="tflite", runtime="tflite", path=out / "model.tflite", files=[], precision="fp32",
                   runner="tflite", runner_options={"signature": "serving_default"})
    judging = Judging(tolerance_for("fp32"), "hop", check_io=True)
    if reason is None:
        check = validate_artifact(art, ir, judging)
        assert check.parity.ok and check.failure is None
        assert check.entry["contract_check"]["fixed_dims"] == {"pixels": {"batch": 1}, "logits": {"batch": 1}}
        assert art.details == {}  # the validation records into its check, never into the artifact
        return
    with pytest.raises(ValidationError, match=reason) as e:
        validate_artifact(art, ir, judging)
    assert e.value.exit_code == 4


def test_bert_pt2_native_through_the_cli(cli, bert_pt2, tmp_path):
    """Today's ONNX route fails on this model (onnx2tf: "Cannot take the length of shape with unknown
    rank"); the native route converts it with int64 token inputs kept, and report.json says so."""
    out = tmp_path / "out"
    r = cli("convert", bert_pt2, "--to", "tflite", "--route", "native", "-o", out)
    assert r.exit_code == 0, r
    report = json.loads((out / "report.json").read_text())
    (art,) = report["artifacts"]
    assert art["route"] == "native" and art["io_dtype"] == "as the contract (64-bit kept)"
    assert all(p["ok"] for p in report["parity"])
    details = load_interpreter(out / "model.tflite").get_input_details()
    assert sorted((d["name"], d["dtype"]) for d in details) == [("attention_mask", np.int64), ("input_ids", np.int64)]


def test_neither_route_converts_names_both_reasons(tmp_path):
    """Det: the ONNX route is tried first and gives a file that needs a Flex (TensorFlow) op, then
    litert-torch has no lowering for it; the error gives both reasons, exit 2, nothing written."""
    import torch

    class Det(torch.nn.Module):
        def forward(self, x):
            return torch.linalg.det(x)

    with pytest.raises(UnsupportedError) as e:
        convert(Det(), tmp_path / "out", ConvertOptions(targets=["tflite"], inputs=["x:2,3,3"]))
    assert e.value.exit_code == 2
    assert e.value.message.startswith("litert-torch could not convert the model")
    assert "after: onnx route (onnx2tf) failed" in e.value.message and "FlexMatrixDeterminant" in e.value.message
    assert not (tmp_path / "out").exists()


def test_missing_litert_torch_is_exit_5_naming_the_install(cli_proc, tmp_path):
    """litert-torch is an optional dependency of this route only: shadowed by a package that fails
    to import, the native route ends with exit 5 and how to install it."""
    shadow = tmp_path / "shadow" / "litert_torch"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('No module named litert_torch')\n")
    src = tmp_path / "mlp.pt2"
    import torch

    torch.export.save(torch.export.export(torch.nn.Linear(4, 2).eval(), (torch.zeros(1, 4),)), src)
    import os

    env = {"PYTHONPATH": os.pathsep.join([str(shadow.parent), os.environ.get("PYTHONPATH", "")])}
    r = cli_proc("convert", src, "--to", "tflite", "--route", "native", "-o", tmp_path / "out", env=env)
    assert r.exit_code == 5, r
    assert "litert-torch" in r.stderr and "pip install" in r.stderr
    assert not (tmp_path / "out").exists()
