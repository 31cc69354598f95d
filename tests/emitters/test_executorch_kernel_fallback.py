"""The ExecuTorch kernel fallback (`emitters/executorch_kernel_fallback.py`): an op whose XNNPACK
kernel breaks the program's numbers is kept out of the XNNPACK partition and run on ExecuTorch's
portable kernels; a fault that no fallback repairs is exit 4 naming the portable ops.

Measured here (executorch 1.5.1, x86-64): the pitch encoder's case (Linear → LayerNorm → Linear
fed a constant frame of -138.5) does not reproduce, XNNPACK holds it to 7e-7; XNNPACK's `sqrt` of
+inf is NaN (the portable kernel's and torch's is +inf), which a frame whose energy overflows
float32 reaches; ExecuTorch's LayerNorm kernel (never XNNPACK's) gives NaN at a constant of -1e20
where torch gives the bias; and fed the input itself at width 192, NaN at the dB floor of silence
(-138.4738, E[x²]-E[x]² cancelling below -eps), which shifted normalisation repairs
(`emitters/norm_fallback.py`)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from modelport.errors import ValidationError
from modelport.runtimes.executorch import ExecuTorchRunner

WIDTH = 384


def _artifact(report: dict) -> dict:
    return next(a for a in report["artifacts"] if a["target"] == "executorch")


def _hop(report: dict) -> dict:
    return next(p for p in report["parity"] if "executorch" in p["hop"])


def _frame_norm_encoder():
    """A frame scaled to unit RMS energy (x / sqrt(mean(x²) + eps)), then Linear → LayerNorm → Linear."""
    import torch

    class FrameNorm(torch.nn.Module):
        def forward(self, x):
            return x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6)

    torch.manual_seed(0)
    return torch.nn.Sequential(FrameNorm(), torch.nn.Linear(WIDTH, WIDTH), torch.nn.LayerNorm(WIDTH),
                               torch.nn.Linear(WIDTH, 64)).eval()


def _layer_norm_encoder():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.LayerNorm(WIDTH), torch.nn.Linear(WIDTH, 64)).eval()


def _pt2(model, path):
    import torch

    torch.export.save(torch.export.export(model, (torch.randn(1, WIDTH),)), path)
    return path


def test_an_op_whose_xnnpack_kernel_gives_nan_is_kept_out_of_xnnpack(cli, tmp_path):
    """A constant frame of -1e18: its energy overflows float32 to +inf; XNNPACK's sqrt of it is NaN,
    so all 64 outputs were NaN (exit 4). aten.sqrt.default is kept out of XNNPACK, the rest stays
    delegated, parity holds, the report and a warning say which op and why."""
    import torch

    model = _frame_norm_encoder()
    r = cli("convert", _pt2(model, tmp_path / "encoder.pt2"), "--to", "executorch", "--value", "input=-1e18",
            "-o", tmp_path / "out", "--json")
    assert r.exit_code == 0, r.stderr
    report = json.loads(r.stdout)
    art = _artifact(report)
    fallback = art["kernel_fallback"]
    assert fallback["kept_out_of_xnnpack"] == ["aten.sqrt.default"]
    assert "with XNNPACK: output" in fallback["reason"] and "64 NaN" in fallback["reason"]
    assert fallback["tries"][0] == {"no_delegate": True, "ok": True} and not fallback["capped"]
    assert art["delegated_partitions"] >= 1 and "aten::sqrt.out" in art["portable_ops"]
    assert _hop(report)["ok"] and _hop(report)["outputs"][0]["nan"] == 0
    assert any("aten.sqrt.default" in w and "portable kernels" in w for w in report["warnings"])
    x = np.full((1, WIDTH), -1e18, np.float32)
    got = ExecuTorchRunner(tmp_path / "out" / "model.pte").run({"input": x})["output"]
    np.testing.assert_allclose(got, model(torch.from_numpy(x)).detach().numpy(), atol=1e-5)


def test_the_silence_constant_holds_on_xnnpack_with_no_fallback(cli, tmp_path):
    """The pitch encoder's case here: Linear → LayerNorm → Linear fed -138.5 holds with XNNPACK
    (LayerNorm runs on the portable kernel), so the program is delivered as lowered."""
    r = cli("convert", _pt2(_layer_norm_encoder(), tmp_path / "encoder.pt2"), "--to", "executorch",
            "--value", "input=-138.5", "-o", tmp_path / "out", "--json")
    assert r.exit_code == 0, r.stderr
    report = json.loads(r.stdout)
    art = _artifact(report)
    assert "kernel_fallback" not in art and art["delegated_partitions"] >= 1
    assert _hop(report)["outputs"][0]["max_abs"] < 1e-5


def test_a_nan_no_fallback_repairs_is_exit_4_naming_the_portable_ops(cli, tmp_path):
    """-1e20 through Linear → LayerNorm: ExecuTorch's LayerNorm kernel gives NaN (with XNNPACK and
    without: it is never XNNPACK's) where torch gives the bias. Exit 4 names the op, nothing written."""
    r = cli("convert", _pt2(_layer_norm_encoder(), tmp_path / "encoder.pt2"), "--to", "executorch", "--route", "native",
            "--value", "input=-1e20", "-o", tmp_path / "out")
    assert r.exit_code == 4, r.stderr
    assert "no kernel fallback repairs it" in r.stderr and "aten::native_layer_norm.out" in r.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("backend,tries", [
    ("xnnpack", [{"no_delegate": True, "ok": False}, {"rewrite": "shifted normalisation", "ok": True}]),
    ("portable", [{"rewrite": "shifted normalisation", "ok": True}]),
])
def test_a_layer_norm_giving_nan_on_silence_is_lowered_again_shifted(cli, tmp_path, backend, tries):
    """LayerNorm(192) fed the dB floor of silence (-138.4738): ExecuTorch's portable LayerNorm
    (E[x²]-E[x]², never XNNPACK's) cancels to a negative variance, NaN with XNNPACK and without, so
    no op kept out repairs it. The module is exported again with shifted normalisation (x - x₀,
    exact zeros) and lowered to the backend asked, and that program, loaded as users load it,
    gives torch's answer."""
    import torch

    from modelport.reference.sample_sets import DB_FLOOR
    from tests.emitters.models import layer_norm_encoder, save_pt2

    model, shape = layer_norm_encoder(192), (1, 16, 192)
    out = tmp_path / "out"
    r = cli("convert", save_pt2(model, tmp_path / "encoder.pt2", shape), "--to", "executorch",
            "--executorch-backend", backend, "-o", out, "--json")
    assert r.exit_code == 0, r.stderr
    report = json.loads(r.stdout)
    art = _artifact(report)
    fallback = art["kernel_fallback"]
    assert fallback["rewrite"] == "shifted normalisation" and fallback["repaired"] is True
    assert fallback["shifted"] == ["layer_norm"] and "floor-db" in fallback["missed_on"] and "NaN" in fallback["why"]
    assert fallback["tries"] == tries and fallback["kept_out_of_xnnpack"] == []
    assert (art["delegated_partitions"] >= 1) == (backend == "xnnpack")
    assert any("executorch" in w and "shifted normalisation" in w for w in report["warnings"])
    assert _hop(report)["ok"] and "floor-db" in [s["kind"] for s in _hop(report)["samples"]]
    for x in (np.full(shape, DB_FLOOR, np.float32), np.random.default_rng(1).standard_normal(shape).astype(np.float32)):
        want = model(torch.from_numpy(x)).detach().numpy()
        got = ExecuTorchRunner(out / "model.pte").run({"input": x})["output"]
        assert np.abs(got - want).max() <= 1e-4 * max(1.0, float(np.abs(want).max())), np.abs(got - want).max()


# --- the search, on stand-in programs: which op types are kept out, in how many lowerings ---------

OPS = ["aten.add.Tensor", "aten.div.Tensor", "aten.linear.default", "aten.mul.Tensor", "aten.sqrt.default"]


def _stand_ins(monkeypatch, holds_when, *, first_holds=False, portable_holds=True):
    """`screen`'s inputs with programs that hold when `holds_when(kept_out)`: the judge compares a
    constant with 0 (NaN when it does not hold); every lowering asked for is recorded."""
    from modelport.emitters import executorch_kernel_fallback as fallback
    from modelport.validation import compare

    lowered = []

    def judge(program, reference, tolerance, work, label):
        kept = program.kept_out
        ok = first_holds if not kept else portable_holds if kept == ("*",) else holds_when(set(kept))
        return compare({"output": np.zeros(3)}, {"output": np.zeros(3) if ok else np.full(3, np.nan)}, tolerance, hop="t")

    def relower(kept_out):
        lowered.append(kept_out)
        if kept_out is None:  # nothing delegated
            return fallback.Program(object(), {"delegates": 0, "operators": ["aten::mean.out"], "delegated_ops": []}, ("*",))
        return fallback.Program(object(), {"delegates": 1, "operators": ["aten::mean.out"], "delegated_ops": OPS}, tuple(kept_out))

    monkeypatch.setattr(fallback, "judge", judge)
    first = fallback.Program(object(), {"delegates": 3, "operators": ["aten::mean.out"], "delegated_ops": OPS + ["getitem"]})
    return first, relower, lowered


def _screen(first, relower):
    from types import SimpleNamespace

    from modelport.emitters.executorch_kernel_fallback import screen
    from modelport.ir import Reference

    return screen(first, relower, Reference({}, {}, "stand-in"), SimpleNamespace(provenance={}), "fp32")


def test_a_program_that_holds_is_delivered_without_another_lowering(monkeypatch):
    first, relower, lowered = _stand_ins(monkeypatch, lambda kept: True, first_holds=True)
    screened = _screen(first, relower)
    assert screened.chosen is first and screened.entry is None and lowered == []


def test_the_halving_finds_the_one_op_that_breaks_the_program(monkeypatch):
    first, relower, lowered = _stand_ins(monkeypatch, lambda kept: "aten.sqrt.default" in kept)
    screened = _screen(first, relower)
    assert screened.entry["kept_out_of_xnnpack"] == ["aten.sqrt.default"] and screened.chosen.kept_out == ("aten.sqrt.default",)
    assert lowered[0] is None and len(lowered) <= 1 + 2 * 3  # the portable program, then two per halving at most
    assert "getitem" not in str(screened.entry["tries"])  # only op types XNNPACK takes by a config of their own
    assert "aten.sqrt.default" in screened.warning and "NaN" in screened.warning


def test_ops_that_break_it_only_together_across_halves_keep_everything_out(monkeypatch):
    first, relower, lowered = _stand_ins(monkeypatch, lambda kept: {"aten.add.Tensor", "aten.sqrt.default"} <= kept)
    screened = _screen(first, relower)
    assert screened.entry["kept_out_of_xnnpack"] == OPS and screened.chosen.kept_out == tuple(OPS)
    assert screened.chosen.info["delegates"] == 0 and len(lowered) == 3  # the portable program, both halves


def test_nan_on_the_portable_kernels_too_is_exit_4_naming_them(monkeypatch):
    first, relower, lowered = _stand_ins(monkeypatch, lambda kept: False, portable_holds=False)
    with pytest.raises(ValidationError) as e:
        _screen(first, relower)
    assert e.value.exit_code == 4 and "no kernel fallback repairs it" in e.value.reason
    assert "aten::mean.out" in e.value.reason and lowered == [None]
