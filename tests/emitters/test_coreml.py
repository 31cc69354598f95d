"""The Core ML target: real coremltools conversions of a CNN, a transformer encoder and a model
with two inputs and two outputs, from PyTorch (native route) and from an ONNX file (generated
code). Core ML cannot run on Linux: the report says `validated: false` with the reason, the I/O
read back from the package's spec must match the contract, `--strict` is exit 4, `validate` on a
package checks its I/O against the other model and says it cannot run it, `inspect` describes it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from modelport.orchestration import ConvertOptions, convert
from modelport.runtimes.coreml import compute_precision, io_specs, load_spec, metadata

pytestmark = pytest.mark.skipif(sys.platform == "darwin", reason="checks the Linux side: on macOS the package is run and compared")
REPO = Path(__file__).resolve().parents[2]


def two_by_two():
    import torch

    class TwoByTwo(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, 3)
            self.fc = torch.nn.Linear(8, 4)

        def forward(self, image, bias):
            h = torch.relu(self.conv(image)).mean((2, 3))
            return self.fc(h) + bias, h * 2

    torch.manual_seed(0)
    return TwoByTwo().eval()


def encoder():
    import torch

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(50, 16)
            self.layer = torch.nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, batch_first=True, dropout=0.0)
            self.head = torch.nn.Linear(16, 3)

        def forward(self, ids):
            return self.head(self.layer(self.embed(ids)))

    torch.manual_seed(0)
    return Encoder().eval()


@pytest.fixture(scope="module")
def onnx_two(tmp_path_factory) -> Path:
    """The two-input, two-output model as an ONNX file with a dynamic batch (a user's ONNX source)."""
    import torch

    folder = tmp_path_factory.mktemp("coreml-src")
    path = folder / "two.onnx"
    torch.onnx.export(two_by_two(), (torch.randn(1, 3, 12, 12), torch.randn(1, 4)), str(path), input_names=["image", "bias"],
                      output_names=["logits", "features"], dynamo=False,
                      dynamic_axes={n: {0: "batch"} for n in ("image", "bias", "logits", "features")})
    return path


@pytest.fixture(scope="module")
def converted_onnx(onnx_two, tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("coreml-onnx") / "out"
    return out, convert(onnx_two, out, ConvertOptions(targets=["coreml"], precision="fp32"))


def _contract_matches(package: Path, report: dict) -> None:
    """The package's spec, read as a user's tools read it, has the contract's names, dtypes and ranks, each fixed dim kept."""
    inputs, outputs = io_specs(load_spec(package))
    narrowed = report["artifacts"][0]["io_dtypes"]  # Core ML's int32 for the contract's int64, and only those
    contract = {w["name"]: w["dtype"] for w in report["contract"]["inputs"] + report["contract"]["outputs"]}
    assert all(contract[name] == "int64" and dtype == "int32" for name, dtype in narrowed.items())
    for got, want in ((inputs, report["contract"]["inputs"]), (outputs, report["contract"]["outputs"])):
        assert [s.name for s in got] == [w["name"] for w in want]
        for s, w in zip(got, want, strict=True):
            assert s.dtype == narrowed.get(w["name"], w["dtype"]) and len(s.shape) == len(w["shape"])
            assert all(g == d for g, d in zip(s.shape, w["shape"], strict=True) if isinstance(d, int))


def _not_validated(report: dict) -> dict:
    (art,) = report["artifacts"]
    assert art["validated"] is False and "macOS" in art["not_validated"] and "Linux" in art["not_validated"]
    assert art["validated_with"] == {"process": "child", "frameworks": ["coremltools"]}  # the spec read as its users read it
    assert any(w.startswith("coreml: the artifact is not validated here") for w in report["warnings"])
    assert not any(p["hop"].endswith("coreml (end to end)") for p in report["parity"])  # nothing claims a comparison
    return art


def test_pytorch_cnn_fp16_native(tmp_path):
    from modelport.validation.report import SCHEMA_FILE

    out = tmp_path / "out"
    report = convert(two_by_two(), out, ConvertOptions(targets=["coreml"], precision="fp16", inputs=["image:batch,3,12,12", "bias:batch,4"],
                                                       output_names=["logits", "features"]))
    art = _not_validated(report)
    assert art["route"] == "native" and art["precision"] == "fp16" and art["path"] == "model.mlpackage"
    assert art["contract_check"]["fixed_dims"] == {n: {"batch": 1} for n in ("image", "bias", "logits", "features")}
    spec = load_spec(out / "model.mlpackage")
    assert spec.WhichOneof("Type") == "mlProgram" and compute_precision(spec) == "fp16"
    assert metadata(spec)["com.modelport.precision"] == "fp16"
    inputs, outputs = io_specs(spec)
    assert [(s.name, s.dtype, s.shape) for s in inputs] == [("image", "float32", [1, 3, 12, 12]), ("bias", "float32", [1, 4])]
    assert [(s.name, s.dtype, s.shape) for s in outputs] == [("logits", "float32", [1, 4]), ("features", "float32", [1, 8])]
    _contract_matches(out / "model.mlpackage", report)
    import jsonschema

    jsonschema.validate(json.loads((out / "report.json").read_text()), json.loads(SCHEMA_FILE.read_text()))


def test_transformer_encoder_fp32_with_token_ids(tmp_path):
    out = tmp_path / "out"
    report = convert(encoder(), out, ConvertOptions(targets=["coreml"], precision="fp32", inputs=["ids:batch,seq:int64"],
                                                    sample_dims={"seq": 6}))
    art = _not_validated(report)
    assert art["precision"] == "fp32" and art["fixed_dims"]["ids"] == {"batch": 1, "seq": 6}
    assert art["io_dtypes"] == {"ids": "int32"}  # Core ML has no int64 I/O: recorded, and accepted by the contract check only there
    spec = load_spec(out / "model.mlpackage")
    assert compute_precision(spec) == "fp32" and metadata(spec)["com.modelport.precision"] == "fp32"
    ops = {op.type for op in spec.mlProgram.functions["main"].block_specializations[spec.mlProgram.functions["main"].opset].operations}
    assert "softmax" in ops and "layer_norm" in ops  # the attention and the norms were converted, not dropped
    _contract_matches(out / "model.mlpackage", report)


def test_onnx_source_through_generated_code(converted_onnx):
    out, report = converted_onnx
    art = _not_validated(report)
    assert art["route"] == "onnx" and "generated PyTorch code" in art["converter"] and art["precision"] == "fp32"
    spec = load_spec(out / "model.mlpackage")
    assert compute_precision(spec) == "fp32"
    _contract_matches(out / "model.mlpackage", report)


def test_strict_is_exit_4_and_leaves_nothing(onnx_two, tmp_path, cli):
    out = tmp_path / "out"
    r = cli("convert", onnx_two, "--to", "coreml", "-o", out, "--strict", "-q")
    assert r.exit_code == 4 and "not validated here" in r.stderr and "--strict" in r.stderr
    assert not out.exists()


def test_cli_warns_and_inspect_describes(converted_onnx, cli):
    out, _ = converted_onnx
    r = cli("inspect", out / "model.mlpackage", "--json")
    assert r.exit_code == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["format"] == "coreml-mlpackage" and info["model_type"] == "ML Program" and info["precision"] == "fp32"
    assert info["spec_version"] >= 7 and [s["name"] for s in info["outputs"]] == ["logits", "features"]
    assert "macOS" in info["note"]


def test_validate_checks_the_spec_and_says_it_cannot_run(converted_onnx, onnx_two, cli):
    out, _ = converted_onnx
    package = out / "model.mlpackage"
    r = cli("validate", package, onnx_two, "--json")
    assert r.exit_code == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["a"]["validated"] is False and "macOS" in report["a"]["not_validated"]
    assert report["a"]["contract_check"]["fixed_dims"]["image"] == {"batch": 1}
    assert report["parity"] == [] and any("not validated here" in w for w in report["warnings"])
    r = cli("validate", onnx_two, package, "--strict", "-q")  # either order; --strict wants a comparison
    assert r.exit_code == 4 and "not validated here" in r.stderr


def test_validate_catches_a_contract_mismatch(converted_onnx, tmp_path, cli):
    import torch

    renamed = tmp_path / "renamed.onnx"  # the same model whose second output has another name
    torch.onnx.export(two_by_two(), (torch.randn(1, 3, 12, 12), torch.randn(1, 4)), str(renamed), input_names=["image", "bias"],
                      output_names=["logits", "embedding"], dynamo=False)
    out, _ = converted_onnx
    r = cli("validate", renamed, out / "model.mlpackage", "-q")
    assert r.exit_code == 4 and "['features', 'logits']" in r.stderr and "embedding" in r.stderr
    other = tmp_path / "wide.onnx"  # another input size than the package takes
    torch.onnx.export(two_by_two(), (torch.randn(1, 3, 16, 16), torch.randn(1, 4)), str(other), input_names=["image", "bias"],
                      output_names=["logits", "features"], dynamo=False)
    r = cli("validate", other, out / "model.mlpackage", "-q")
    assert r.exit_code == 4 and "'image'" in r.stderr and "[1, 3, 12, 12]" in r.stderr


def test_doctor_says_build_only():
    from modelport.orchestration.doctor import doctor

    entry = next(t for t in doctor()["targets"] if t["name"] == "coreml")
    assert entry["ready"] and entry["runs_here"] is False and "built here" in entry["note"] and "macOS" in entry["note"]


def test_refusals_before_any_work(onnx_two, tmp_path, cli):
    from modelport.emitters.coreml_options import CoreMLOptions
    from modelport.errors import BadInputError

    r = cli("convert", onnx_two, "--to", "coreml", "--precision", "int8", "-o", tmp_path / "o", "-q")
    assert r.exit_code == 2 and "fp16, fp32" in r.stderr and not (tmp_path / "o").exists()
    with pytest.raises(BadInputError, match="deployment target"):
        CoreMLOptions(deployment_target="iOS9")
    assert CoreMLOptions(deployment_target="ios17").deployment_target == "iOS17"


def test_missing_coremltools_is_exit_5(onnx_two, tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import sys\nsys.modules['coremltools'] = None\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO / "src"), str(REPO)])}
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "modelport", "convert", str(onnx_two), "--to", "coreml", "-o", str(out), "-q"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 5, r.stderr
    assert 'pip install "modelport[coreml]"' in r.stderr and "coremltools" in r.stderr and not out.exists()


def test_fp16_is_core_ml_s_own_default_whatever_the_other_targets(onnx_two, tmp_path):
    """Each target keeps its own default unless --precision is given: Core ML's fp16 beside ONNX's
    fp32 (it used to fall to fp32 as soon as another target was asked for)."""
    from modelport.orchestration.request import decide

    def precisions(**kw):
        return {t: r.precision for t, r in decide(onnx_two, tmp_path / "o", ConvertOptions(**kw)).precisions.items()}

    assert precisions(targets=["coreml"]) == {"coreml": "fp16"}
    assert precisions(targets="coreml,onnx") == {"coreml": "fp16", "onnx": "fp32"}
    assert precisions(targets="coreml,onnx", precision="fp32") == {"coreml": "fp32", "onnx": "fp32"}


def test_an_op_it_cannot_take_is_exit_2_naming_it(tmp_path, cli):
    from tests.emitters.models import det_model, save_onnx

    src = save_onnx(det_model(), tmp_path / "src", "det.onnx")
    r = cli("convert", src, "--to", "coreml", "-o", tmp_path / "out", "-q")
    assert r.exit_code == 2 and "det_node (Det)" in r.stderr and "Core ML" in r.stderr and not (tmp_path / "out").exists()


def test_coremltools_import_leaves_torch_dynamo_whole():
    """The frameworks kept out of coremltools' import look absent to `find_spec` while it runs:
    torch._dynamo, imported on the way, probes for tensorflow that way and an exception there left it
    half-initialised (`torch.export` then failed with "torch._dynamo has no attribute 'exc'")."""
    code = ("import sys, importlib.util\n"
            "from modelport.runtimes.coreml import require_coremltools\n"
            "probe = importlib.util.find_spec\n"
            "require_coremltools()\n"
            "import torch._dynamo\n"
            "assert hasattr(torch._dynamo, 'exc'), 'torch._dynamo half-initialised'\n"
            "assert 'tensorflow' not in sys.modules\n"
            "assert importlib.util.find_spec is probe\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
