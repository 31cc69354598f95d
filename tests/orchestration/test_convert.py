"""The convert pipeline's validation rules, on real models through the Python API."""

from __future__ import annotations

import re

import pytest
import torch

import modelport
from modelport.errors import ValidationError


class BigLogits(torch.nn.Module):
    """Logits in the thousands: torch and onnxruntime sum 4096 products in another order, so
    elements near zero differ by ~1e-3 while the output agrees to cosine 1.000000."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(4096, 1000)
        with torch.no_grad():
            self.fc.weight.normal_(0, 30.0)

    def forward(self, x):
        return self.fc(x)


def test_large_logits_pass_at_their_scale(tmp_path):
    report = modelport.convert(BigLogits().eval(), tmp_path / "o", inputs=["x:batch,4096"])
    out = report["parity"][0]["outputs"][0]
    assert out["ok"] and out["max_abs"] > 1e-4  # a fixed atol of 1e-4 would have failed this hop
    assert out["tolerance"]["scale"] > 1000 and out["tolerance"]["atol_effective"] == pytest.approx(1e-4 * out["tolerance"]["scale"])
    assert out["cosine"] > 0.999999


class BigLogitsMisconverted(BigLogits):
    """The exported graph shifts one logit by 5 (0.08% of the output's scale): a wrong conversion."""

    def forward(self, x):
        y = self.fc(x)
        if torch.compiler.is_exporting() or torch.jit.is_tracing():
            y = y + torch.nn.functional.one_hot(torch.tensor(7), 1000).to(y.dtype) * 5.0
        return y


def test_large_logits_genuinely_wrong_still_fail(tmp_path):
    with pytest.raises(ValidationError) as e:
        modelport.convert(BigLogitsMisconverted().eval(), tmp_path / "o", inputs=["x:batch,4096"])
    out = e.value.parity["outputs"][0]
    assert not out["ok"] and out["max_abs"] == pytest.approx(5.0, abs=0.05) and "elements outside" in out["reason"]
    assert out["cosine"] > 0.999999  # the cosine alone would not have caught it
    assert not (tmp_path / "o").exists()


def test_per_output_override_applies_to_that_output_only(tmp_path):
    class Two(torch.nn.Module):
        def forward(self, x):
            return {"a": x * 2, "b": x + 1}

    opts = modelport.ConvertOptions(inputs=["x:2,3"], output_tolerances={"b": {"atol": 0.25}})
    report = modelport.convert(Two(), tmp_path / "o", options=opts)
    tols = {o["name"]: o["tolerance"]["atol"] for o in report["parity"][-1]["outputs"]}
    assert tols == {"a": 1e-4, "b": 0.25}


def test_convert_options_compose_the_stage_options(tiny_onnx, tmp_path):
    from modelport.emitters.tflite_options import TFLiteOptions
    from modelport.errors import BadInputError
    from modelport.optimize.pipeline import OptimizeOptions
    from modelport.orchestration.request import decide

    opts = modelport.ConvertOptions(targets="onnx,tflite", optimize="all", target_options={"tflite": TFLiteOptions(layout="nhwc")},
                                    atol=1e-5)
    request = decide(tiny_onnx, tmp_path / "o", opts)
    assert opts.optimize.level == "all" and request.target_options("tflite").layout == "nhwc"
    assert request.target_options("onnx") is None
    assert opts.package.trust  # packaging inside convert may trace the PyTorch code this run emitted
    with pytest.raises(BadInputError, match="set precision, calibration, strict and allow_precision_fallback on ConvertOptions"):
        decide(tiny_onnx, tmp_path / "p", modelport.ConvertOptions(optimize=OptimizeOptions(precision="fp16")))
    assert not (tmp_path / "p").exists()
    with pytest.raises(BadInputError, match="unknown optimisation level 'max'"):
        modelport.ConvertOptions(optimize="max")


def test_python_api_takes_values_as_a_dict(tmp_path):
    from tests.test_samples import _control_input_model

    model = _control_input_model(tmp_path / "vad.onnx")
    report = modelport.convert(model, tmp_path / "out", modelport.ConvertOptions(values={"sr": 16000}))
    assert report["status"] == "ok" and report["contract"]["given_inputs"] == ["sr"]


def test_the_ir_weights_wait_in_a_file_while_an_artifact_is_validated(tmp_path, monkeypatch):
    """Validation's child loads the artifact while this process needs only the references: a model
    past modelport.ir.PARK_BYTES (here every model) is its graph alone meanwhile, and whole again
    for the next target."""
    import importlib

    import onnx

    from modelport import ir as ir_module
    forward = importlib.import_module("modelport.orchestration.forward")
    artifact_module = importlib.import_module("modelport.validation.artifact")

    monkeypatch.setattr(ir_module, "PARK_BYTES", 0)
    seen, current = [], {}
    validate, check = forward.validate_artifact, artifact_module.check

    def spy_validate(artifact, ir, judging):
        current.update(target=artifact.target, ir=ir)
        return validate(artifact, ir, judging)

    def spy_check(runner, reference, tol, hop):  # while the artifact's runtime runs it
        seen.append((current["target"], {t.data_location for t in current["ir"].model.graph.initializer if t.dims and t.dims[0] > 16}))
        return check(runner, reference, tol, hop)

    monkeypatch.setattr(forward, "validate_artifact", spy_validate)
    monkeypatch.setattr(artifact_module, "check", spy_check)
    report = modelport.convert(BigLogits().eval(), tmp_path / "o", inputs=["x:batch,4096"], targets=["onnx", "openvino"])
    assert list(dict.fromkeys(t for t, _ in seen)) == ["onnx", "openvino"]  # OpenVINO's plain load is judged too
    assert all(locations == {onnx.TensorProto.EXTERNAL} for _, locations in seen)
    assert all(p["ok"] for p in report["parity"])


def test_the_ir_before_the_passes_is_let_go_once_they_are_done(tmp_path, monkeypatch):
    """`--optimize`: every target is emitted from the optimised IR, so the one the passes started from
    does not keep its weights beside it."""
    import modelport.orchestration.optimize_stage as optimize_module  # the forward pipeline imports `optimise` from here

    given = []
    original = optimize_module.optimise

    def spy(ir, *args, **kwargs):
        given.append(ir)
        return original(ir, *args, **kwargs)

    monkeypatch.setattr(optimize_module, "optimise", spy)
    report = modelport.convert(BigLogits().eval(), tmp_path / "o", inputs=["x:batch,4096"], targets=["onnx"],
                               optimize="all")
    assert all(p["ok"] for p in report["parity"]) and len(given) == 1
    assert given[0].model is None


@pytest.mark.parametrize("kwargs, message", [
    ({"optimize": "all", "targets": ["onnx"], "arch_args": {"width": 2}}, "--arch-args are keyword arguments for the --arch constructor"),
    ({"state_dict_key": "model"}, "--state-dict-key picks the weights of a checkpoint loaded into --arch"),
    ({"optimize": "none", "runtimes": ("onnxruntime",)}, "--runtimes names the runtimes --optimize auto compares"),
    ({"runtimes": ("onnxruntime",)}, "--runtimes names the runtimes --optimize auto compares"),
    ({"optimize": "auto", "targets": ["onnx", "tflite"]}, "--optimize auto picks an onnxruntime variant or an OpenVINO one; it cannot feed tflite"),
    ({"sample_dims": {"batch": 9}, "dim_bounds": {"batch": "1..4"}}, "batch=9 is outside the sizes declared for it"),
    ({"task": "text-generation", "optimize": "auto", "reference": "streamed"}, "--optimize auto judges its variants against the transformers"),
    ({"task": "text-generation", "precision": "fp16", "optimize": "auto"}, "--optimize auto times its variants on the CPU"),
])
def test_refusals_that_need_no_model_are_made_by_decide_before_anything_is_read(tiny_onnx, tmp_path, kwargs, message):
    """Each is exit 2 from `decide` (the source is not even opened: a text-generation run is handed a
    folder that does not exist), and no output is written."""
    from modelport.errors import BadInputError
    from modelport.optimize.pipeline import OptimizeOptions
    from modelport.orchestration.request import decide
    from modelport.orchestration.text_generation_options import TextGenerationOptions

    kwargs = dict(kwargs)
    level, runtimes = kwargs.pop("optimize", None), kwargs.pop("runtimes", None)
    if level is not None or runtimes is not None:
        kwargs["optimize"] = OptimizeOptions(level=level, runtimes=runtimes)
    if "reference" in kwargs:
        kwargs["text_generation"] = TextGenerationOptions(reference=kwargs.pop("reference"))
    source = tmp_path / "no-such-folder" if kwargs.get("task") == "text-generation" else tiny_onnx
    with pytest.raises(BadInputError, match=re.escape(message)):
        decide(source, tmp_path / "out", modelport.ConvertOptions(**kwargs))
    assert not (tmp_path / "out").exists()
