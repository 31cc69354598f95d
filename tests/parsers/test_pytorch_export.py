"""Export routes: a real Swin and T5 that the dynamo exporter alone cannot export, every attempt
recorded, and one exit-2 line when no route works."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from modelport.errors import BadInputError
from modelport.parsers import SourceSpec, parse
from modelport.parsers.pytorch_export import ExportFailedError, reason_of
from modelport.resolve.specs import parse_input_spec
from modelport.runtimes.onnxruntime import OnnxRuntimeRunner
from tests.transformers_models import build, export_pt2

DECOMPOSE_FAILURE = "Failed to decompose the FX graph for ONNX compatibility (ValueError: Cannot view a tensor"


@pytest.fixture(scope="module")
def pt2s(tmp_path_factory):
    d = tmp_path_factory.mktemp("hf_pt2")
    return {name: export_pt2(name, d) for name in ("swin_cls", "t5_encoder", "t5")}


def _routes(stage: dict) -> list[tuple[str, bool]]:
    return [(a["route"], a["ok"]) for a in stage["attempts"]]


def test_swin_pt2_converts_in_a_fresh_process(cli_proc, pt2s, tmp_path):
    """The user path: a new process (the file's SwinImageClassifierOutput never registered there),
    a program exported with keyword inputs, and the dynamo exporter failing on Swin's attention:
    the saved program lowered to core ATen exports, and every attempt is in the report and on stderr."""
    out = tmp_path / "out"
    r = cli_proc("convert", pt2s["swin_cls"], "--to", "onnx", "-o", out, "--json")
    assert r.exit_code == 0, r.stderr[-2000:]
    report = json.loads(r.stdout)
    parse_stage = report["stages"][0]
    assert _routes(parse_stage) == [("dynamo", False), ("dynamo-program-decomposed", True)]
    assert DECOMPOSE_FAILURE in parse_stage["attempts"][0]["reason"]
    assert all(isinstance(a["seconds"], float) for a in parse_stage["attempts"])
    assert parse_stage["exporter"] == "torch.onnx dynamo (saved program, core ATen decompositions)"
    assert "warning: export route dynamo failed: Failed to decompose" in r.stderr
    assert [o["name"] for o in report["contract"]["outputs"]] == ["logits"]
    # the batch stays dynamic in the model (not traced at the sample size)
    feeds = {"pixel_values": np.random.default_rng(0).standard_normal((3, 3, 32, 32)).astype(np.float32)}
    got = OnnxRuntimeRunner(out / "model.onnx").run(feeds)
    model, _ = build("swin_cls")
    with torch.no_grad():
        want = model(pixel_values=torch.from_numpy(feeds["pixel_values"])).logits.numpy()
    np.testing.assert_allclose(got["logits"], want, atol=1e-4)


@pytest.mark.parametrize("name", ["t5_encoder", "t5"])
def test_t5_pt2_converts_through_decompositions(cli, pt2s, tmp_path, name):
    r = cli("convert", pt2s[name], "--to", "onnx", "-o", tmp_path / "out", "--json")
    assert r.exit_code == 0, r
    parse_stage = r.json()["stages"][0]
    assert _routes(parse_stage) == [("dynamo", False), ("dynamo-program-decomposed", True)]
    assert DECOMPOSE_FAILURE in parse_stage["attempts"][0]["reason"]
    inputs = ["input_ids"] if name == "t5_encoder" else ["input_ids", "decoder_input_ids"]
    assert [i["name"] for i in r.json()["contract"]["inputs"]] == inputs


def test_pt2_whose_shapes_the_user_changed_is_traced_again_then_decomposed(pt2s):
    """--input fixing the batch: the saved program no longer fits the contract, so its module is
    exported again with the user's shapes, lowered to core ATen, then to ONNX."""
    path = pt2s["t5_encoder"]
    ir = parse(path, SourceSpec(path=path, inputs=[parse_input_spec("input_ids:3,8")]))
    assert [(a["route"], a["ok"]) for a in ir.provenance["export_attempts"]] == [("dynamo", False), ("dynamo-decomposed", True)]
    assert [[d.dim_value for d in i.type.tensor_type.shape.dim] for i in ir.model.graph.input] == [[3, 8]]


def test_live_t5_module_falls_back_to_decompositions():
    """An nn.Module (not a file) takes the same class of fix: torch.export, core ATen, then ONNX."""
    model, _ = build("t5_encoder")
    ir = parse(model, SourceSpec(inputs=[parse_input_spec("input_ids:batch,8:int64")]))
    assert [(a["route"], a["ok"]) for a in ir.provenance["export_attempts"]] == [("dynamo", False), ("dynamo-decomposed", True)]
    assert ir.provenance["exporter"] == "torch.onnx dynamo (core ATen decompositions)"
    ids = np.random.default_rng(1).integers(0, 99, (3, 8))
    got = OnnxRuntimeRunner(ir.model).run({"input_ids": ids})
    with torch.no_grad():
        want = model(input_ids=torch.from_numpy(ids)).last_hidden_state.numpy()
    np.testing.assert_allclose(got["last_hidden_state"], want, atol=1e-4)


class Eigvals(torch.nn.Module):
    """linalg.eigvals: no ONNX exporter translates it."""

    def forward(self, x):
        return torch.linalg.eigvals(x).real


def test_every_route_failing_is_exit_2_naming_the_file_and_each_reason(cli, tmp_path):
    ep = torch.export.export(Eigvals(), (torch.randn(2, 4, 4),), dynamic_shapes=({0: torch.export.Dim("batch")},))
    path = tmp_path / "eig.pt2"
    torch.export.save(ep, str(path))
    r = cli("convert", path, "--to", "onnx", "-o", tmp_path / "out", "--json")
    assert r.exit_code == 2
    lines = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and str(path) in lines[0] and "every export route failed" in lines[0]
    for route in ("dynamo:", "dynamo-program-decomposed:", "dynamo-program:", "torchscript:"):
        assert route in lines[0]
    assert "linalg_eigvals" in lines[0]
    attempts = r.json()["stages"][0]["attempts"]
    assert [a["route"] for a in attempts] == ["dynamo", "dynamo-program-decomposed", "dynamo-program", "torchscript"]
    assert not any(a["ok"] for a in attempts) and all(a["reason"] for a in attempts)
    assert not (tmp_path / "out").exists()
    with pytest.raises(ExportFailedError) as e:
        parse(Eigvals(), SourceSpec(inputs=[parse_input_spec("x:batch,4,4")]))
    assert isinstance(e.value, BadInputError) and e.value.exit_code == 2
    assert [a.route for a in e.value.attempts] == ["dynamo", "dynamo-decomposed", "torchscript"]


def test_reason_is_one_line_with_the_underlying_error():
    err = RuntimeError("\x1b[96mFailed to decompose the FX graph for ONNX compatibility.\x1b[0m This is step 2/3 of exporting"
                       " the model to ONNX. Next steps:\n- Create an issue\n\n## Exception summary\n\n"
                       "<class 'ValueError'>: Cannot view a tensor with shape torch.Size([2, 8])!\n\nWhile executing %view")
    assert reason_of(err) == ("Failed to decompose the FX graph for ONNX compatibility "
                              "(ValueError: Cannot view a tensor with shape torch.Size([2, 8])!)")


def test_torchscript_exporter_reason_names_the_source_line_not_the_graph_value():
    """The TorchScript exporter's error (as silero-vad's .jit raises it) names an internal graph value;
    the reason keeps the message and the source line it marks."""
    err = RuntimeError(
        "ONNX export does NOT support exporting bitwise Not for non-boolean input values  [Caused by the value '137 defined "
        "in (%137 : Long(requires_grad=0, device=cpu) = onnx::Constant[value={0}](), scope: vad.VADRNNJITMerge:: # "
        "/home/x/vad/model/vad_annotator.py:693:15\n)' (type 'Tensor') in the TorchScript graph. The containing node has "
        "kind 'onnx::Constant'.] \n    (node defined in   File \"/home/x/vad/model/vad_annotator.py\", line 693\n"
        "            self.reset_states()\n    \n        if not len(self._context):\n               ~~~ <--- HERE\n")
    assert reason_of(err) == ("ONNX export does NOT support exporting bitwise Not for non-boolean input values "
                              "(at vad_annotator.py:693: if not len(self._context):)")


class _Encoderish(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(512, 64)
        self.proj = torch.nn.Linear(64, 32)
        self.scale = torch.nn.Parameter(torch.tensor([0.5, 2.0]))  # under 1 KB: stays in the graph

    def forward(self, ids):
        return self.proj(self.embed(ids)) * self.scale[0] + self.scale[1]


@pytest.mark.parametrize("route", ["module", "program"])
def test_weights_written_to_files_are_the_weights_the_in_memory_export_holds(tmp_path, route):
    """`weights_dir`: the graph comes back with its large tensors in a data file, written from the
    torch tensors; read back, the model is the in-memory export's, tensor for tensor and node for node."""
    import onnx

    from modelport.ir import IRModel
    from modelport.parsers.pytorch_export import STORED_MIN_BYTES, export_model
    from modelport.resolve.specs import TensorSpec

    module = _Encoderish().eval()
    specs = [TensorSpec("ids", "int64", ["batch", 7])]
    args = [torch.randint(0, 512, (2, 7))]
    program = torch.export.export(module, tuple(args)) if route == "program" else None
    kwargs = dict(program=program, program_shapes_kept=route == "program")
    whole = export_model(module, args, specs, ["y"], **kwargs)
    streamed = export_model(module, args, specs, ["y"], weights_dir=tmp_path, **kwargs)
    assert whole.stored is None and streamed.stored is not None and streamed.stored.parent == tmp_path
    large = [t for t in streamed.model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    assert {t.name for t in large} and all(not t.raw_data for t in large)
    small = [t for t in streamed.model.graph.initializer if t.data_location != onnx.TensorProto.EXTERNAL]
    assert all(t.ByteSize() < STORED_MIN_BYTES + 200 for t in small)
    ir = IRModel(model=streamed.model, inputs=specs, outputs=[], stored=streamed.stored).attach_stored()
    assert ir.stored is None
    values = {t.name: onnx.numpy_helper.to_array(t) for t in whole.model.graph.initializer}
    assert {t.name for t in ir.model.graph.initializer} == set(values)
    for t in ir.model.graph.initializer:
        np.testing.assert_array_equal(onnx.numpy_helper.to_array(t), values[t.name])
    assert [n.op_type for n in ir.model.graph.node] == [n.op_type for n in whole.model.graph.node]
    feeds = {"ids": args[0].numpy()}
    np.testing.assert_array_equal(OnnxRuntimeRunner(ir.model).run(feeds)["y"], OnnxRuntimeRunner(whole.model).run(feeds)["y"])


def test_convert_reads_the_exported_weights_in_after_the_parse(tmp_path):
    """Through convert: the IR holds its weights again once the parse is over (nothing left pointing
    into the export's scratch folder, which is gone), and every target still matches the source."""
    import onnx

    import modelport

    report = modelport.convert(_Encoderish().eval(), tmp_path / "o", inputs=["ids:batch,7:int64"], targets=["onnx"])
    assert all(p["ok"] for p in report["parity"])
    model = onnx.load(str(tmp_path / "o" / "model.onnx"))
    assert not any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)
    assert not list(tmp_path.glob("**/*.data"))
