"""PyTorch files saved on a GPU, converted on a CPU-only machine.

The fixtures are written here the way a GPU machine writes them (checked against files saved on an
H100 with torch 2.11: the archive's weight and graph metadata say `{"type": "cuda", "index": 0}`,
device arguments in the graph say the same, the sample inputs are a pickle with CUDA storages, and a
traced TorchScript graph holds a `prim::Constant[value="cuda:0"]`). Each fixture is first shown to
fail to load or run on this CPU build, as the real file does.
"""

from __future__ import annotations

import json
import sys
import types
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from modelport.parsers.pytorch_devices import archive_devices, move_constants_to_cpu


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        y = self.fc(torch.relu(self.bn(self.conv(x))).mean(dim=(2, 3)))
        return y + torch.arange(5, device=x.device, dtype=y.dtype)  # a device argument in the graph


def _on_cuda(obj):
    if isinstance(obj, dict):
        return {k: ({"type": "cuda", "index": 0} if k in ("device", "as_device") and isinstance(v, dict) else _on_cuda(v))
                for k, v in obj.items()}
    if isinstance(obj, list):
        return [_on_cuda(v) for v in obj]
    return obj


def cuda_pt2(src: Path, dst: Path, monkeypatch) -> Path:
    """`src` rewritten as torch.export.save writes it on a GPU."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info.filename)
            if info.filename.endswith(".json") and ("/models/" in info.filename or "/data/" in info.filename):
                data = json.dumps(_on_cuda(json.loads(data))).encode()
            elif "/data/sample_inputs/" in info.filename:
                import io

                obj = torch.load(io.BytesIO(data), weights_only=True)
                buf = io.BytesIO()
                with monkeypatch.context() as m:  # storages tagged as torch tags CUDA ones
                    m.setattr(torch.serialization, "location_tag", lambda storage: "cuda:0")
                    torch.save(obj, buf)
                data = buf.getvalue()
            zout.writestr(info, data, compress_type=info.compress_type)
    return dst


@pytest.fixture(scope="module")
def model_and_input():
    torch.manual_seed(0)
    m = Net().eval()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        ref = m(x).numpy()
    return m, x, ref


def test_pt2_saved_on_a_gpu_converts_on_the_cpu(tmp_path, model_and_input, monkeypatch, cli):
    m, x, ref = model_and_input
    torch.export.save(torch.export.export(m, (x,)), tmp_path / "cpu.pt2")
    src = cuda_pt2(tmp_path / "cpu.pt2", tmp_path / "gpu.pt2", monkeypatch)
    assert archive_devices(src) == {"cuda:0"} and archive_devices(tmp_path / "cpu.pt2") == {"cpu"}
    if torch.cuda.is_available():  # a GPU machine loads it with its weights on the GPU, which CPU inputs cannot meet
        assert {p.device.type for p in torch.export.load(str(src)).state_dict.values()} == {"cuda"}
    else:  # a CPU build cannot load it at all, as the real file
        with pytest.raises((RuntimeError, AssertionError), match="CUDA"):
            torch.export.load(str(src))
    before = src.read_bytes()
    r = cli("convert", src, "--to", "onnx", "-o", tmp_path / "out")
    assert r.exit_code == 0, r.stderr
    assert "saved on cuda:0" in r.stderr
    import onnxruntime as ort

    s = ort.InferenceSession(str(tmp_path / "out/model.onnx"))
    got = s.run(None, {s.get_inputs()[0].name: x.numpy()})[0]
    np.testing.assert_allclose(got, ref, atol=1e-5)
    report = json.loads((tmp_path / "out/report.json").read_text())
    assert any("saved on cuda:0" in w for w in report["warnings"])
    assert src.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["cpu.pt2", "gpu.pt2", "out"]


def _device_constants(module) -> list[str]:
    return [n.s("value") for n in module.graph.findAllNodes("prim::Constant")
            if n.output().type().kind() == "DeviceObjType" and n.hasAttribute("value")]


def test_torchscript_traced_on_a_gpu_runs_on_the_cpu(tmp_path, model_and_input, cli):
    m, x, ref = model_and_input
    with torch.no_grad():
        traced = torch.jit.trace(m, x)
    g = traced.graph  # what tracing on cuda:0 records: the device as a constant
    for node in g.findAllNodes("prim::Constant"):
        if node.output().type().kind() == "DeviceObjType":
            with g.insert_point_guard(node):
                cuda = g.insertConstant(torch.device("cuda:0"))
            node.output().replaceAllUsesWith(cuda)
            node.destroy()
    traced.save(str(tmp_path / "gpu.jit"))
    loaded = torch.jit.load(str(tmp_path / "gpu.jit"), map_location="cpu")
    assert _device_constants(loaded) == ["cuda:0"]
    with pytest.raises((RuntimeError, NotImplementedError)):  # map_location alone does not help: the constant stays
        torch.jit.load(str(tmp_path / "gpu.jit"), map_location="cpu")(x)
    assert move_constants_to_cpu(loaded) == ["cuda:0"] and _device_constants(loaded) == ["cpu"]
    np.testing.assert_allclose(loaded(x).detach().numpy(), ref, atol=1e-6)

    r = cli("convert", tmp_path / "gpu.jit", "--trust", "--input", "x:2x3x16x16", "--to", "onnx", "-o", tmp_path / "out")
    assert r.exit_code == 0, r.stderr
    assert "saved on cuda:0" in r.stderr
    assert "export route" not in r.stderr  # torch.export never takes a ScriptModule: not tried, so no warning
    report = json.loads((tmp_path / "out/report.json").read_text())
    assert all(p["ok"] for p in report["parity"])
    assert [a["route"] for a in next(s for s in report["stages"] if s["name"] == "parse")["attempts"]] == ["torchscript"]


def test_pickled_model_whose_class_is_gone_is_exit_2(tmp_path, model_and_input, cli):
    m, _, _ = model_and_input
    notebook = types.ModuleType("notebook_cell")  # a class defined in a script or notebook
    cls = type("Net", (Net,), {"__module__": "notebook_cell"})
    notebook.Net = cls
    sys.modules["notebook_cell"] = notebook
    try:
        obj = cls()
        obj.load_state_dict(m.state_dict())
        torch.save(obj, tmp_path / "model.pt")
    finally:
        del sys.modules["notebook_cell"]
    r = cli("convert", tmp_path / "model.pt", "--trust", "--input", "x:2x3x16x16", "--to", "onnx", "-o", tmp_path / "out")
    assert r.exit_code == 2, r.stderr
    err = r.stderr.strip()
    assert len(err.splitlines()) == 1 and "model.pt" in err and "cannot be imported here" in err and "--arch" in err
    assert not (tmp_path / "out").exists()
