"""Dims declared with bounds (`--dim batch=1..8`, `--dim seq=4,8,16`) kept dynamic by the edge targets,
each artifact run at its smallest, a middle and its largest size in its own runtime, and shown by
`inspect`: a CNN with a dynamic batch, a transformer encoder with a dynamic batch and sequence."""

from __future__ import annotations

import json

import numpy as np
import pytest

from modelport.orchestration import ConvertOptions, convert


def _artifact(report: dict, target: str) -> dict:
    return next(a for a in report["artifacts"] if a["target"] == target)


def _sizes(entry: dict) -> list[dict]:
    return [row["dims"] for row in entry["sizes"]]


@pytest.fixture(scope="module")
def cnn():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                               torch.nn.Flatten(), torch.nn.Linear(4, 5)).eval()


class Encoder:
    """A transformer encoder block over token ids: embedding, self-attention, FFN, a per-token head."""

    @staticmethod
    def build():
        import torch

        class Block(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.embed = torch.nn.Embedding(50, 16)
                self.layer = torch.nn.TransformerEncoderLayer(16, 2, 32, batch_first=True, dropout=0.0)
                self.head = torch.nn.Linear(16, 3)

            def forward(self, ids):
                return self.head(self.layer(self.embed(ids)))

        torch.manual_seed(0)
        return Block().eval()


@pytest.fixture(scope="module")
def cnn_out(cnn, tmp_path_factory):
    out = tmp_path_factory.mktemp("dyn_cnn") / "out"
    report = convert(cnn, out, ConvertOptions(targets=["onnx", "executorch", "coreml", "tflite", "tfjs"],
                                              inputs=["pixels:batch,3,16,16"], output_names=["logits"],
                                              sample_dims={"batch": "1..8"}))
    return out, report


def test_a_cnn_keeps_its_batch_in_every_edge_artifact_and_runs_at_three_sizes(cnn_out):
    out, report = cnn_out
    assert report["contract"]["dims"] == {"batch": {"kind": "range", "min": 1, "max": 8}}
    assert report["contract"]["sample_dims"]["batch"] == 2
    batch = {"kind": "range", "min": 1, "max": 8}
    for target in ("onnx", "executorch", "tflite", "tfjs"):
        art = _artifact(report, target)
        assert art["dims"] == {"pixels": {"batch": batch}}, target
        assert not art.get("fixed_dims"), target
        # its own runtime (ExecuTorch's, LiteRT, Node for TF.js) at the smallest, a middle and the largest batch
        assert _sizes(art) == [{"batch": 1}, {"batch": 4}, {"batch": 8}], target
        assert all(row["ok"] and row["cosine"] > 0.9999 for row in art["sizes"]), (target, art["sizes"])
    coreml = _artifact(report, "coreml")
    assert coreml["dims"] == {"pixels": {"batch": batch}} and coreml["fixed_dims"] == {}
    assert coreml["contract_check"]["fixed_dims"] == {}  # the spec read back names the flexible dim as the contract does
    assert not [w for w in report["warnings"] if "fixes dynamic dims" in w]


def test_the_program_takes_each_batch_within_its_bounds_and_refuses_others(cnn, cnn_out):
    import torch

    from modelport.errors import BadInputError
    from modelport.runtimes.executorch import ExecuTorchRunner

    out, _ = cnn_out
    runner = ExecuTorchRunner(out / "model.pte")
    assert [(s.name, s.shape) for s in runner.input_specs()] == [("pixels", ["batch", 3, 16, 16])]
    assert [(s.name, s.shape) for s in runner.output_specs()] == [("logits", ["batch", 5])]
    for n in (1, 3, 8):
        x = np.random.default_rng(n).standard_normal((n, 3, 16, 16)).astype(np.float32)
        got = runner.run({"pixels": x})["logits"]
        assert got.shape == (n, 5)
        np.testing.assert_allclose(got, cnn(torch.from_numpy(x)).detach().numpy(), atol=1e-5)
    with pytest.raises(BadInputError, match=r"takes the shape \[batch in 1..8, 3, 16, 16\] in this program; fed \[9, 3, 16, 16\]"):
        runner.run({"pixels": np.zeros((9, 3, 16, 16), np.float32)})


def test_inspect_shows_the_bounds_of_each_format(cnn_out, cli):
    out, _ = cnn_out
    for name in ("model.onnx", "model.pte", "model.mlpackage"):
        r = cli("inspect", out / name, "--json")
        assert r.exit_code == 0, r
        (pixels,) = r.json()["inputs"]
        assert pixels["dims"][0] == {"name": "batch", "kind": "range", "min": 1, "max": 8}, name
        assert pixels["dims"][1:] == [{"kind": "fixed", "size": n} for n in (3, 16, 16)], name
    r = cli("inspect", out / "model.tflite", "--json")
    assert r.json()["inputs"][0]["dims"][0]["kind"] == "dynamic"  # -1 in the file's shape signature
    r = cli("inspect", out / "model.pte")
    assert "batch[1..8],3,16,16" in r.stdout


@pytest.fixture(scope="module")
def encoder_out(tmp_path_factory):
    out = tmp_path_factory.mktemp("dyn_encoder") / "out"
    report = convert(Encoder.build(), out, ConvertOptions(targets=["executorch", "coreml", "tflite", "tfjs"],
                                                          inputs=["ids:batch,seq:int64"], sample_dims={"batch": "1..4", "seq": "4..16"}))
    return out, report


def test_a_transformer_encoder_keeps_batch_and_sequence(encoder_out, cli):
    out, report = encoder_out
    want = {"ids": {"batch": {"kind": "range", "min": 1, "max": 4}, "seq": {"kind": "range", "min": 4, "max": 16}}}
    for target in ("executorch", "tflite", "tfjs"):
        art = _artifact(report, target)
        assert art["dims"] == want, target
        assert not art.get("fixed_dims"), target
        # its own runtime (ExecuTorch's, LiteRT, Node for TF.js) at the smallest, a middle and the largest size
        assert _sizes(art) == [{"batch": 1, "seq": 4}, {"batch": 2, "seq": 10}, {"batch": 4, "seq": 16}], target
        assert all(row["ok"] and row["cosine"] > 0.9999 for row in art["sizes"]), (target, art["sizes"])
    assert _artifact(report, "executorch")["route"] == "native"
    # onnx2tf stops at the attention's run-time reshapes; modelport's ONNX lowering keeps both dims, and says so
    for target in ("tflite", "tfjs"):
        art = _artifact(report, target)
        assert art["route"] == "onnx", target
        assert art["converter"].startswith("modelport ONNX lowering (onnx2tf"), art["converter"]
        assert "could not convert the model" in art["converter"], art["converter"]
    model_json = json.loads((out / "tfjs" / "model.json").read_text())
    sig = model_json["signature"]
    assert [d["size"] for d in sig["inputs"]["ids"]["tensorShape"]["dim"]] == ["-1", "-1"]
    assert [d["size"] for d in sig["outputs"]["output"]["tensorShape"]["dim"]] == ["-1", "-1", "3"]
    r = cli("inspect", out / "tfjs" / "model.json", "--json")  # the bounds come from model.json's metadata
    assert r.json()["inputs"][0]["dims"] == [{"name": "batch", "kind": "range", "min": 1, "max": 4},
                                             {"name": "seq", "kind": "range", "min": 4, "max": 16}]
    assert "batch[1..4],seq[4..16],3" in cli("inspect", out / "tfjs" / "model.json").stdout
    r = cli("inspect", out / "model.tflite", "--json")
    assert [d["kind"] for d in r.json()["inputs"][0]["dims"]] == ["dynamic", "dynamic"]  # -1 twice in the signature
    assert report["contract"]["inputs"][0]["value_range"] == [0, 50]  # ids sampled as ids at every size
    coreml = _artifact(report, "coreml")
    assert coreml["dims"] == want
    import coremltools as ct

    spec = ct.utils.load_spec(str(out / "model.mlpackage"))
    ranges = spec.description.input[0].type.multiArrayType.shapeRange.sizeRanges
    assert [(r.lowerBound, r.upperBound) for r in ranges] == [(1, 4), (4, 16)]


def test_listed_sizes_are_core_ml_enumerated_shapes(tmp_path):
    import coremltools as ct

    report = convert(Encoder.build(), tmp_path / "out", ConvertOptions(targets=["coreml"], inputs=["ids:1,seq:int64"],
                                                                       sample_dims={"seq": "4,8,16"}))
    assert _artifact(report, "coreml")["dims"] == {"ids": {"seq": {"kind": "sizes", "sizes": [4, 8, 16]}}}
    spec = ct.utils.load_spec(str(tmp_path / "out" / "model.mlpackage"))
    shapes = sorted(list(s.shape) for s in spec.description.input[0].type.multiArrayType.enumeratedShapes.shapes)
    assert shapes == [[1, 4], [1, 8], [1, 16]]
    meta = dict(spec.description.metadata.userDefined)
    assert json.loads(meta["com.modelport.dims"]) == {"ids": {"1": "seq"}}


def test_listed_sizes_are_one_tflite_signature_each_run_in_litert(tmp_path, cli):
    """litert-torch traces static shapes: listed sizes become one signature per size in one file,
    each run in LiteRT at its size; the runner picks the signature whose shapes take the feeds, and
    `inspect` names the dims from the keys."""
    import torch

    from modelport.runtimes.tflite import TFLiteRunner

    out = tmp_path / "out"
    module = Encoder.build()
    report = convert(module, out, ConvertOptions(targets=["tflite"], route="native", inputs=["ids:batch,seq:int64"],
                                                 sample_dims={"batch": "1,2", "seq": "4,8,16"}))
    art = _artifact(report, "tflite")
    assert art["route"] == "native"
    want = {"ids": {"batch": {"kind": "sizes", "sizes": [1, 2]}, "seq": {"kind": "sizes", "sizes": [4, 8, 16]}}}
    assert art["dims"] == want and not art["fixed_dims"] and not art["contract_check"]["fixed_dims"]
    keys = [s["key"] for s in art["signatures"]]
    assert keys[0] == "batch_2_seq_4" and sorted(keys) == sorted(f"batch_{b}_seq_{n}" for b in (1, 2) for n in (4, 8, 16))
    assert _sizes(art) == [{"batch": 1, "seq": 4}, {"batch": 2, "seq": 8}, {"batch": 2, "seq": 16}]
    assert all(row["ok"] and row["cosine"] > 0.9999 for row in art["sizes"]), art["sizes"]
    assert not [w for w in report["warnings"] if "fixes dynamic dims" in w]

    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(str(out / "model.tflite"))  # as a LiteRT user calls it: by the signature's key
    assert set(interpreter.get_signature_list()) == {*keys, "serving_default"}
    for b, n in ((1, 4), (1, 16), (2, 8)):
        ids = np.random.default_rng(n).integers(0, 50, (b, n))
        got = interpreter.get_signature_runner(f"batch_{b}_seq_{n}")(ids=ids)["output"]
        np.testing.assert_allclose(got, module(torch.from_numpy(ids)).detach().numpy(), atol=1e-4)
    runner = TFLiteRunner(out / "model.tflite", signature="serving_default")
    assert runner.run({"ids": np.zeros((1, 16), np.int64)})["output"].shape == (1, 16, 3)
    r = cli("inspect", out / "model.tflite")
    assert "batch{1,2},seq{4,8,16}" in r.stdout, r.stdout
    r = cli("inspect", out / "model.tflite", "--json")
    assert r.json()["inputs"][0]["dims"][1] == {"name": "seq", "kind": "sizes", "sizes": [4, 8, 16]}
    assert r.json()["outputs"][0]["dims"][2] == {"kind": "fixed", "size": 3}


def test_a_route_that_cannot_keep_a_declared_dim_is_exit_2_naming_it(tmp_path, cli):
    """litert-torch converts static shapes: asked to keep `seq` within bounds it refuses, naming the
    dim, instead of fixing it silently."""
    import torch

    path = tmp_path / "encoder.pt2"
    dims = {0: torch.export.Dim("batch", max=16), 1: torch.export.Dim("seq", min=2, max=64)}
    torch.export.save(torch.export.export(Encoder.build(), (torch.randint(0, 50, (2, 8)),), dynamic_shapes=(dims,)), str(path))
    r = cli("convert", path, "--input", "ids:batch,seq:int64", "--to", "tflite", "--route", "native",
            "--dim", "seq=4..16", "-o", tmp_path / "out")
    assert r.exit_code == 2, r
    assert "litert-torch converts static shapes: it cannot keep seq=4..16 dynamic" in r.stderr
    assert not (tmp_path / "out").exists()
