"""The ExecuTorch target: `.pte` programs from PyTorch sources (torch.export, the native route) and
from an ONNX file (the generated PyTorch code), run in ExecuTorch's own runtime in a clean child
and here (`ExecuTorchRunner`): parity, the contract's names at the program's I/O, int8 through
PT2E, `validate` and `inspect` on a `.pte`, and exit 2 naming the op ExecuTorch cannot take."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from modelport.errors import BadInputError, UnsupportedError
from modelport.orchestration import ConvertOptions, convert
from modelport.runtimes.executorch import ExecuTorchRunner


def _artifact(report: dict, target: str = "executorch") -> dict:
    return next(a for a in report["artifacts"] if a["target"] == target)


def _hop(report: dict) -> dict:
    return next(p for p in report["parity"] if p["hop"].endswith("executorch (native, end to end)")
                or p["hop"].endswith("executorch (end to end)"))


@pytest.fixture(scope="module")
def cnn():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                               torch.nn.Flatten(), torch.nn.Linear(4, 5)).eval()


@pytest.fixture(scope="module")
def cnn_out(cnn, tmp_path_factory):
    """(output folder, report): the CNN to ONNX and to ExecuTorch (native, XNNPACK), batch left dynamic."""
    out = tmp_path_factory.mktemp("et_cnn") / "out"
    report = convert(cnn, out, ConvertOptions(targets=["onnx", "executorch"], inputs=["pixels:batch,3,16,16"],
                                              output_names=["logits"]))
    return out, report


def test_cnn_runs_in_executorch_with_the_contracts_names(cnn, cnn_out):
    import torch

    out, report = cnn_out
    art = _artifact(report)
    assert art["route"] == "native" and art["backend"] == "xnnpack" and art["delegated_partitions"] >= 1
    assert art["validated_with"] == {"process": "child", "frameworks": ["executorch", "torch"]}
    assert art["fixed_dims"] == {"pixels": {"batch": 1}} and art["contract_check"]["fixed_dims"]["logits"] == {"batch": 1}
    hop = _hop(report)
    assert hop["ok"] and all(o["max_abs"] < 1e-4 for o in hop["outputs"])
    runner = ExecuTorchRunner(out / "model.pte")
    assert [(s.name, s.dtype, s.shape) for s in runner.input_specs()] == [("pixels", "float32", [1, 3, 16, 16])]
    assert [(s.name, s.dtype, s.shape) for s in runner.output_specs()] == [("logits", "float32", [1, 5])]
    x = np.random.default_rng(3).standard_normal((1, 3, 16, 16)).astype(np.float32)
    got = runner.run({"pixels": x})["logits"]
    np.testing.assert_allclose(got, cnn(torch.from_numpy(x)).detach().numpy(), atol=1e-5)
    with pytest.raises(BadInputError, match=r"fixed at the shape \[1, 3, 16, 16\]"):
        runner.run({"pixels": np.zeros((2, 3, 16, 16), np.float32)})


def test_validate_and_inspect_read_a_pte(cli, cnn_out):
    out, _ = cnn_out
    r = cli("inspect", out / "model.pte", "--json")
    assert r.exit_code == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["format"] == "executorch" and "forward" in info["methods"]
    assert [i["name"] for i in info["inputs"]] == ["pixels"] and [o["name"] for o in info["outputs"]] == ["logits"]
    r = cli("validate", out / "model.onnx", out / "model.pte", "--dim", "batch=1", "--json")
    assert r.exit_code == 0, r.stderr
    (bad := out.parent / "not.pte").write_bytes(b"\0" * 64)
    assert cli("validate", out / "model.onnx", bad).exit_code == 2


def test_transformer_encoder(tmp_path):
    import torch

    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model=16, nhead=2, dim_feedforward=32, batch_first=True, dropout=0.0)
    encoder = torch.nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False).eval()
    report = convert(encoder, tmp_path / "out", ConvertOptions(targets=["executorch"], inputs=["tokens:batch,6,16"],
                                                               output_names=["hidden"]))
    art = _artifact(report)
    assert art["route"] == "native" and art["methods"]["input_names"] == ["tokens"]
    assert _hop(report)["ok"]
    runner = ExecuTorchRunner(tmp_path / "out" / "model.pte")
    assert [s.name for s in runner.output_specs()] == ["hidden"] and runner.output_specs()[0].shape == [1, 6, 16]


class TwoInTwoOut:
    @staticmethod
    def build():
        import torch

        class Model(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = torch.nn.Linear(8, 4)

            def forward(self, a, b):
                return self.lin(a) + b.sum(-1, keepdim=True), torch.relu(a).mean(-1)

        torch.manual_seed(1)
        return Model().eval()


@pytest.fixture(scope="module")
def two_io(tmp_path_factory):
    """Two inputs, two outputs, the portable backend (no delegate); and its ONNX file."""
    out = tmp_path_factory.mktemp("et_two") / "out"
    report = convert(TwoInTwoOut.build(), out, ConvertOptions(
        targets=["onnx", "executorch"], inputs=["a:batch,8", "b:batch,3"], output_names=["total", "mean"],
        target_options={"executorch": _options(backend="portable")}))
    return out, report


def _options(**kw):
    from modelport.emitters.executorch_options import ExecuTorchOptions

    return ExecuTorchOptions(**kw)


def test_two_inputs_two_outputs_on_the_portable_kernels(two_io):
    out, report = two_io
    art = _artifact(report)
    assert art["backend"] == "portable" and art["delegated_partitions"] == 0 and art["portable_ops"]
    assert _hop(report)["ok"]
    runner = ExecuTorchRunner(out / "model.pte")
    assert [s.name for s in runner.input_specs()] == ["a", "b"] and [s.name for s in runner.output_specs()] == ["total", "mean"]
    rng = np.random.default_rng(0)
    feeds = {"b": rng.standard_normal((1, 3)).astype(np.float32), "a": rng.standard_normal((1, 8)).astype(np.float32)}
    got = runner.run(feeds)
    import torch

    want = TwoInTwoOut.build()(torch.from_numpy(feeds["a"]), torch.from_numpy(feeds["b"]))
    np.testing.assert_allclose(got["total"], want[0].detach().numpy(), atol=1e-5)
    np.testing.assert_allclose(got["mean"], want[1].detach().numpy(), atol=1e-5)


def test_an_onnx_file_goes_through_the_generated_code(two_io, tmp_path):
    src, _ = two_io
    report = convert(src / "model.onnx", tmp_path / "out", ConvertOptions(targets=["executorch"]))
    art = _artifact(report)
    assert art["route"] == "onnx" and "generated PyTorch code" in art["converter"] and art["backend"] == "xnnpack"
    assert art["validated_with"]["frameworks"] == ["executorch", "torch"]
    assert _hop(report)["ok"]
    runner = ExecuTorchRunner(tmp_path / "out" / "model.pte")
    assert [s.name for s in runner.input_specs()] == ["a", "b"] and [s.name for s in runner.output_specs()] == ["total", "mean"]


def test_int8_through_pt2e_with_calibration_data(cli, cnn, cnn_out, tmp_path):
    out_fp32, _ = cnn_out
    cal = tmp_path / "cal.npz"
    np.savez(cal, input=np.random.default_rng(5).standard_normal((8, 3, 16, 16)).astype(np.float32))
    import torch

    (tmp_path / "src").mkdir()
    torch.export.save(torch.export.export(cnn, (torch.zeros(2, 3, 16, 16),),
                                          dynamic_shapes=({0: torch.export.Dim("batch")},)), tmp_path / "src" / "cnn.pt2")
    r = cli("convert", tmp_path / "src" / "cnn.pt2", "--to", "executorch", "--precision", "int8", "--calibration", cal,
            "-o", tmp_path / "out", "--json")
    assert r.exit_code == 0, r.stderr
    art = _artifact(json.loads(r.stdout))
    assert art["precision"] == "int8" and art["route"] == "native"
    assert art["quantization"].startswith("PT2E int8") and "8 set(s) of --calibration data" in art["quantization"]
    x = {"pixels": np.random.default_rng(6).standard_normal((1, 3, 16, 16)).astype(np.float32)}
    quantised = ExecuTorchRunner(tmp_path / "out" / "model.pte")
    assert [s.name for s in quantised.input_specs()] == ["input"]  # the program's own name
    q, f = next(iter(quantised.run({"input": x["pixels"]}).values())), ExecuTorchRunner(out_fp32 / "model.pte").run(x)["logits"]
    assert not np.array_equal(q, f) and np.corrcoef(q.ravel(), f.ravel())[0, 1] > 0.98


def test_int8_on_the_portable_backend_and_unknown_backends_are_exit_2(cli, cnn_out, tmp_path):
    out, _ = cnn_out
    r = cli("convert", out / "model.onnx", "--to", "executorch", "--precision", "int8", "--executorch-backend", "portable",
            "-o", tmp_path / "a")
    assert r.exit_code == 2 and "--executorch-backend xnnpack" in r.stderr and not (tmp_path / "a").exists()
    r = cli("convert", out / "model.onnx", "--to", "executorch", "--executorch-backend", "vulkan", "-o", tmp_path / "b")
    assert r.exit_code == 2 and "xnnpack" in r.stderr and not (tmp_path / "b").exists()
    assert cli("convert", out / "model.onnx", "--to", "executorch", "--precision", "fp16", "-o", tmp_path / "c").exit_code == 2


def test_an_op_executorch_cannot_take_is_exit_2_naming_it(tmp_path):
    """torch.sort: the runtime has no kernel for aten::sort (native route); the generated code's
    stable sort is outside the Core ATen opset (ONNX route). Both named, nothing written."""
    import torch

    class Sorts(torch.nn.Module):
        def forward(self, x):
            return torch.sort(x, dim=-1).values * 2

    with pytest.raises(UnsupportedError) as e:
        convert(Sorts(), tmp_path / "out", ConvertOptions(targets=["executorch"], inputs=["x:4,6"]))
    assert e.value.exit_code == 2
    assert "aten::sort.values" in e.value.reason and "aten.sort" in e.value.reason.split("(after:")[0]
    assert not (tmp_path / "out").exists()


def test_a_blocked_framework_is_absent_to_find_spec_and_unimportable():
    """In a clean child, libraries that probe with importlib.util.find_spec (torch._dynamo) see a
    blocked framework as not installed; importing it still fails."""
    code = ("import importlib.util, json; from modelport.runtimes.isolated import block_imports; block_imports(['onnx'], 'x');"
            "r = [importlib.util.find_spec('onnx') is None, importlib.util.find_spec('onnx.helper') is None,"
            " importlib.util.find_spec('json') is not None]\n"
            "try:\n    import onnx\n    r.append(False)\nexcept ModuleNotFoundError:\n    r.append(True)\nprint(json.dumps(r))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert json.loads(p.stdout) == [True, True, True, True], p.stderr


def test_a_gru_network_to_executorch_stops_at_its_stage_bound(cli, tmp_path):
    """Two GRUs in an ONNX file: the generated code's export to ExecuTorch takes minutes here (one
    such model in the wild ran 15 minutes at 16.5 GB before it was killed). Under a bound the
    stage stops at it, names itself and the flag, and leaves nothing."""
    import time

    import torch

    class TwoGRU(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.GRU(16, 32, batch_first=True), torch.nn.GRU(32, 32, batch_first=True)
            self.head = torch.nn.Linear(32, 4)

        def forward(self, x):
            return self.head(self.b(self.a(x)[0])[0])

    src = tmp_path / "gru.onnx"
    torch.onnx.export(TwoGRU().eval(), (torch.randn(1, 20, 16),), str(src), input_names=["x"], output_names=["y"],
                      dynamo=False, opset_version=17)
    start = time.monotonic()
    r = cli("convert", src, "--to", "executorch", "-o", tmp_path / "out", "--stage-timeout", "10")
    assert r.exit_code == 2, r.stderr
    assert time.monotonic() - start < 90
    assert "stage 'emit:executorch' ran" in r.stderr and "past its bound of 10 s" in r.stderr and "--stage-timeout" in r.stderr
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.staging-*"))
