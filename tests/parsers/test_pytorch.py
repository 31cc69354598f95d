"""PyTorch sources: every file kind, trust gating, state dicts with --arch, export fallbacks."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from modelport.errors import BadInputError, UnsafeInputError
from modelport.parsers import SourceSpec, parse
from modelport.resolve.specs import parse_input_spec
from modelport.runtimes.onnxruntime import OnnxRuntimeRunner
from modelport.zoo_builders.pytorch import MLP


class Marker:
    """Unpickling this runs code that writes a marker file."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (Path(self.path).write_text, ("pwned",))


@pytest.fixture(scope="module")
def mlp_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("mlp")
    m = MLP().eval()
    torch.save(m.state_dict(), d / "state.pt")
    torch.save({"state_dict": m.state_dict(), "epoch": 3}, d / "ckpt.pth")
    torch.save(m, d / "module.pt")
    torch.jit.save(torch.jit.script(m), d / "scripted.pt")
    from safetensors.torch import save_file

    save_file(m.state_dict(), str(d / "w.safetensors"))
    ep = torch.export.export(m, (torch.randn(2, 32),), dynamic_shapes=({0: torch.export.Dim("batch")},))
    torch.export.save(ep, str(d / "m.pt2"))
    return d, m


def spec(path, **kw):
    kw.setdefault("inputs", [parse_input_spec("x:batch,32")])
    return SourceSpec(path=Path(path), **kw)


def test_state_dict_with_zoo_arch(mlp_files):
    d, m = mlp_files
    ir = parse(d / "state.pt", spec(d / "state.pt", arch="zoo:mlp"))
    assert ir.provenance["format"].startswith("state dict")
    # the state dict's weights were used, not a fresh init: references equal the original module's outputs
    x = ir.reference.inputs["x"]
    np.testing.assert_allclose(ir.reference.outputs["output"], m(torch.from_numpy(x)).detach().numpy(), rtol=1e-6)
    # dynamic batch survives export: run with a different batch size
    out = OnnxRuntimeRunner(ir.model).run({"x": np.ones((5, 32), np.float32)})
    assert out["output"].shape == (5, 4)


def test_checkpoint_wrapper_and_safetensors(mlp_files):
    d, _ = mlp_files
    for name in ("ckpt.pth", "w.safetensors"):
        ir = parse(d / name, spec(d / name, arch="zoo:mlp"))
        assert ir.inputs[0].shape == ["batch", 32]


def test_exported_program(mlp_files):
    d, _ = mlp_files
    ir = parse(d / "m.pt2", spec(d / "m.pt2"))
    assert ir.provenance["format"] == "exported_program"


def test_pickled_module_needs_trust(mlp_files):
    d, _ = mlp_files
    with pytest.raises(UnsafeInputError, match="unsafe pickle global"):
        parse(d / "module.pt", spec(d / "module.pt"))
    ir = parse(d / "module.pt", spec(d / "module.pt", trust=True))
    assert ir.provenance["format"] == "pickled nn.Module"


def test_torchscript_needs_trust(mlp_files):
    d, _ = mlp_files
    with pytest.raises(UnsafeInputError, match="TorchScript"):
        parse(d / "scripted.pt", spec(d / "scripted.pt"))
    ir = parse(d / "scripted.pt", spec(d / "scripted.pt", trust=True))
    assert ir.provenance["format"] == "torchscript"


def test_reduce_payload_never_runs(tmp_path):
    marker = tmp_path / "marker"
    bad = tmp_path / "evil.pt"
    torch.save({"w": torch.ones(1), "x": Marker(marker)}, bad)
    for kw in ({}, {"arch": "zoo:mlp"}):
        with pytest.raises(UnsafeInputError, match="unsafe pickle global"):
            parse(bad, spec(bad, **kw))
    assert not marker.exists()


def test_arch_class_import_needs_trust(mlp_files):
    d, _ = mlp_files
    with pytest.raises(UnsafeInputError, match="imports and runs code"):
        parse(d / "state.pt", spec(d / "state.pt", arch="modelport.zoo_builders.pytorch:MLP"))
    ir = parse(d / "state.pt", spec(d / "state.pt", arch="modelport.zoo_builders.pytorch:MLP", trust=True))
    assert ir.outputs[0].name == "output"


def test_state_dict_without_arch_and_mismatched_arch(mlp_files):
    d, _ = mlp_files
    with pytest.raises(BadInputError, match="needs an architecture"):
        parse(d / "state.pt", spec(d / "state.pt"))
    with pytest.raises(BadInputError, match="does not fit"):
        parse(d / "state.pt", spec(d / "state.pt", arch="zoo:lstm_small"))


def test_missing_input_specs(mlp_files):
    """TorchScript and pickled modules carry no input contract (a .pt2 does: see test_pt2_*)."""
    d, _ = mlp_files
    for name in ("scripted.pt", "module.pt"):
        with pytest.raises(BadInputError, match="need input specs"):
            parse(d / name, SourceSpec(path=d / name, trust=True))


def test_lfs_pointer_and_garbage(tmp_path):
    p = tmp_path / "m.pt"
    p.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:0\nsize 1\n")
    with pytest.raises(BadInputError, match="git-LFS"):
        parse(p, spec(p))
    p.write_bytes(b"\x01\x02garbage" * 10)
    with pytest.raises(BadInputError, match="not a PyTorch file"):
        parse(p, spec(p, arch="zoo:mlp"))


def test_bad_safetensors_header(tmp_path):
    p = tmp_path / "w.safetensors"
    p.write_bytes((10**12).to_bytes(8, "little") + b"{}")
    with pytest.raises(BadInputError, match="header"):
        parse(p, spec(p, arch="zoo:mlp"))


def test_dict_outputs_are_named_and_fallback_exporter_recorded():
    class TwoHeads(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(4, 2)
            self.b = torch.nn.Linear(4, 3)

        def forward(self, x):
            return {"logits": self.a(x), "embedding": self.b(x)}

    ir = parse(TwoHeads(), SourceSpec(inputs=[parse_input_spec("x:batch,4")]))
    assert [o.name for o in ir.outputs] == ["logits", "embedding"]
    assert ir.provenance["exporter"] == "torch.onnx dynamo"


def test_pickle_protocol_marker_is_not_executed_without_trust(tmp_path):
    """A raw (non-zip) pickle stream with a payload is refused too."""
    marker = tmp_path / "marker2"
    p = tmp_path / "raw.pth"
    p.write_bytes(pickle.dumps(Marker(marker)))
    with pytest.raises((UnsafeInputError, BadInputError)):
        parse(p, spec(p))
    assert not marker.exists()


class HalfDead(torch.nn.Module):
    """`y` depends on the input; `c` is x * 0 + 3, the same for any input (proves nothing)."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(32, 4)

    def forward(self, x):
        return {"y": self.fc(x), "c": x[:, :2] * 0.0 + 3.0}


def test_reference_varies_per_output():
    ir = parse(HalfDead().eval(), SourceSpec(inputs=[parse_input_spec("x:batch,32")]))
    assert ir.provenance["reference_varies"] == {"y": True, "c": False}
    # the reference data used for parity are the first sample set, as before
    from modelport.reference.samples import make_inputs

    assert np.array_equal(ir.reference.inputs["x"], make_inputs([parse_input_spec("x:batch,32")], {}, seed=0)["x"])


class Masked(torch.nn.Module):
    """Two inputs sharing a batch and a sequence dim; the sequence must be at least 3 long."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 4)

    def forward(self, x, mask):
        return self.proj(x * mask.unsqueeze(-1).float()).sum(1), x * 2


@pytest.fixture(scope="module")
def masked_pt2(tmp_path_factory):
    batch, seq = torch.export.Dim("batch", min=1, max=64), torch.export.Dim("seq", min=3, max=512)
    torch.manual_seed(0)
    ep = torch.export.export(Masked().eval(), (torch.randn(2, 5, 8), torch.ones(2, 5, dtype=torch.int64)),
                             dynamic_shapes={"x": {0: batch, 1: seq}, "mask": {0: batch, 1: seq}})
    path = tmp_path_factory.mktemp("pt2") / "masked.pt2"
    torch.export.save(ep, str(path))
    return path


def test_pt2_carries_its_input_contract(masked_pt2):
    """No --input: names, dtypes, static and dynamic dims come from the program; a shared symbol is
    one named dim, and its range (seq >= 3) moves the sample size into it."""
    ir = parse(masked_pt2, SourceSpec(path=masked_pt2))
    assert [(s.name, s.dtype, s.shape) for s in ir.inputs] == [
        ("x", "float32", ["batch", "x_dim1", 8]), ("mask", "int64", ["batch", "x_dim1"])]
    assert ir.sample_dims == {"x_dim1": 3} and ir.reference.inputs["x"].shape == (2, 3, 8)
    graph_in = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in ir.model.graph.input}
    assert graph_in == {"x": ["batch", "x_dim1", 8], "mask": ["batch", "x_dim1"]}
    x = np.random.default_rng(1).standard_normal((4, 7, 8)).astype(np.float32)
    mask = np.ones((4, 7), np.int64)
    got = OnnxRuntimeRunner(ir.model).run({"x": x, "mask": mask})
    with torch.no_grad():
        want = torch.export.load(str(masked_pt2)).module()(torch.from_numpy(x), torch.from_numpy(mask))
    np.testing.assert_allclose(got[list(got)[0]], want[0].numpy(), atol=1e-5)


def test_pt2_input_overrides_by_name_and_refuses_unknown_names(masked_pt2):
    ir = parse(masked_pt2, SourceSpec(path=masked_pt2, inputs=[parse_input_spec("x:batch,6,8"), parse_input_spec("mask:batch,6")]))
    assert [s.shape for s in ir.inputs] == [["batch", 6, 8], ["batch", 6]]
    with pytest.raises(BadInputError, match=r"unknown input 'y'; the model's inputs are \['x', 'mask'\]"):
        parse(masked_pt2, SourceSpec(path=masked_pt2, inputs=[parse_input_spec("y:2,4")]))


def test_inspect_pt2_shows_the_contract(cli, masked_pt2):
    r = cli("inspect", masked_pt2, "--json")
    assert r.exit_code == 0, r
    info = r.json()
    batch, length = ({"name": "batch", "kind": "range", "min": 1, "max": 64},
                     {"name": "x_dim1", "kind": "range", "min": 3, "max": 512})  # the program's range constraints
    assert info["inputs"] == [{"name": "x", "dtype": "float32", "shape": ["batch", "x_dim1", 8],
                               "dims": [batch, length, {"kind": "fixed", "size": 8}]},
                              {"name": "mask", "dtype": "int64", "shape": ["batch", "x_dim1"], "dims": [batch, length]}]
    assert info["dynamic_dims"]["x"] == {"batch": {"kind": "range", "min": 1, "max": 64},
                                         "x_dim1": {"kind": "range", "min": 3, "max": 512}}
    assert [(o["dtype"], o["shape"]) for o in info["outputs"]] == [("float32", ["batch", 4]), ("float32", ["batch", "x_dim1", 8])]


def test_pt2_inputs_renamed_in_order_when_every_name_is_new(masked_pt2):
    """`--input ids:... --input attn:...` on a program whose inputs are x and mask: the user's names,
    in order, as --input always gave a .pt2; the program's dtypes stay (mask is int64)."""
    ir = parse(masked_pt2, SourceSpec(path=masked_pt2, inputs=[parse_input_spec("ids:batch,4,8"), parse_input_spec("attn:batch,4")]))
    assert [(s.name, s.dtype, s.shape) for s in ir.inputs] == [("ids", "float32", ["batch", 4, 8]), ("attn", "int64", ["batch", 4])]
    assert [i.name for i in ir.model.graph.input] == ["ids", "attn"]


class SampleRateGate(torch.nn.Module):
    """A forward that takes a Python int, as silero-vad's TorchScript model takes its sample rate."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 4)

    def forward(self, x, sr: int):
        if sr == 16000:
            return self.lin(x)
        return self.lin(x) * 2.0


def test_torchscript_with_a_scalar_int_input(tmp_path, cli):
    """`--input sr:scalar:int64` declares the 0-d input (without it: 'needs a shape', exit 2) and
    `--value sr=16000` pins it; the ONNX and PyTorch-code artifacts keep `sr` as an input."""
    path = tmp_path / "gate.pt"
    torch.jit.save(torch.jit.script(SampleRateGate().eval()), str(path))
    r = cli("convert", path, "--trust", "--input", "x:batch,8", "--input", "sr:int64", "--value", "sr=16000",
            "--to", "onnx", "-o", tmp_path / "refused", "--json")
    assert r.exit_code == 2 and "sr:scalar:int64" in r.json()["error"]["message"]
    r = cli("convert", path, "--trust", "--input", "x:batch,8", "--input", "sr:scalar:int64", "--value", "sr=16000",
            "--to", "onnx,pytorch", "-o", tmp_path / "out", "--json")
    assert r.exit_code == 0, r
    report = r.json()
    assert [(i["name"], i["dtype"], i["shape"]) for i in report["contract"]["inputs"]] == [("x", "float32", ["batch", 8]),
                                                                                         ("sr", "int64", [])]
    assert report["parity"] and all(p["ok"] for p in report["parity"])
    assert report["contract"]["given_inputs"] == ["sr"]
    # torch.export takes no ScriptModule: the TorchScript exporter is the one route tried, with no failed-route warnings
    assert [a["route"] for a in report["stages"][0]["attempts"]] == ["torchscript"] and not report["warnings"]


# --- sample sets that are valid inputs, at the magnitudes real inputs take -------------------------

class PositionalLM(torch.nn.Module):
    """A decoder called with positional arguments: its `.pt2` names the inputs args_0 and args_1."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, *args):
        ids, mask = args
        return self.lm(input_ids=ids, attention_mask=mask, use_cache=False).logits


def test_a_positionally_exported_gpt2_gets_ids_and_a_mask_from_its_graph(tmp_path, cli):
    """args_0 feeds the embedding Gather (ids in [0, vocab)), args_1 is cast to bool (a mask: ones).
    By name alone args_1 took integers 0..9, masking whole rows: exit 4 on `random-3`, max abs 0.05."""
    import transformers

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=100, n_positions=64)
    lm = PositionalLM(transformers.GPT2LMHeadModel(cfg).eval())
    ids, mask = torch.randint(0, 100, (1, 8)), torch.ones(1, 8, dtype=torch.long)
    path = tmp_path / "gpt2.pt2"
    torch.export.save(torch.export.export(lm, (ids, mask)), str(path))
    r = cli("convert", path, "--to", "onnx", "-o", tmp_path / "out", "--json")
    assert r.exit_code == 0, r
    report = r.json()
    assert [(i["name"], i.get("value_range")) for i in report["contract"]["inputs"]] == [("args_0", [0, 100]),
                                                                                          ("args_1", [1, 2])]
    samples = report["parity"][0]["samples"]
    assert [s["kind"] for s in samples] == ["random", "random-2", "random-3", "low", "high"]
    assert all(s["ok"] for s in samples)


class FrameNorm(torch.nn.Module):
    """A pitch encoder's front: a LayerNorm over a 384-wide frame, then a projection."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(384)
        self.proj = torch.nn.Linear(384, 8)
        with torch.no_grad():
            self.norm.weight.normal_()
            self.norm.bias.normal_()

    def forward(self, frame):
        return self.proj(self.norm(frame))


def test_a_layernorm_frame_is_judged_at_full_mantissa_constant_frames(tmp_path, cli):
    """A frame with no declared range is also judged at the floors preprocessing makes (-138.47 dB
    and -15.94, the dB and log of float32 silence) and at seeded full-mantissa constants; the
    structured sets before reached 1.0 at most. torch's LayerNorm computes a constant frame's mean
    exactly: the output is the norm's bias through the projection, finite and steady one ulp away."""
    from modelport.reference.sample_sets import DB_FLOOR, SWEEP_KINDS

    torch.manual_seed(0)
    path = tmp_path / "frame.pt2"
    torch.export.save(torch.export.export(FrameNorm().eval(), (torch.randn(1, 16, 384),)), str(path))
    r = cli("convert", path, "--to", "onnx", "-o", tmp_path / "out", "--json")
    assert r.exit_code == 0, r
    for hop in r.json()["parity"]:
        assert [s["kind"] for s in hop["samples"]] == ["random", "random-2", "random-small", "zeros", "constant",
                                                      *(k for k in SWEEP_KINDS if k != "grey-raw")]  # not an image
        assert all(s["ok"] and "ill_conditioned" not in s for s in hop["samples"])
    ir = parse(path, SourceSpec(path=path))
    sets = {s.kind: s for s in ir.reference.extra}
    assert (sets["floor-db"].inputs["frame"] == np.float32(DB_FLOOR)).all()
    for kind in ("floor-db", "floor-log", "full-mantissa", "full-mantissa-large"):
        assert np.isfinite(sets[kind].outputs["output"]).all() and sets[kind].nudged is not None
        np.testing.assert_allclose(sets[kind].nudged["output"], sets[kind].outputs["output"], atol=1e-3)
