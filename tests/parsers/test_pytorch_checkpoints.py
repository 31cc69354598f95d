"""Checkpoints as people save them: another configuration of the --arch class (--arch-args), the
weights nested in a training checkpoint (found by their keys, or --state-dict-key), DataParallel's
`module.` prefix, and two candidates that both fit."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from modelport.errors import BadInputError
from modelport.parsers.pytorch import load_module
from modelport.specs import SourceSpec, parse_input_spec
from modelport.zoo_builders.pytorch import MLP

ARCH = f"{__name__}:Configurable"


class Configurable(nn.Module):
    """A model family whose checkpoints differ by configuration, as `model="tiny"` vs the default."""

    def __init__(self, model: str = "full", dim: int = 32, bias: bool = True):
        super().__init__()
        width = {"tiny": 8, "full": 16}[model]
        self.fc1 = nn.Linear(dim, width, bias=bias)
        self.fc2 = nn.Linear(width, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("ckpt")
    torch.manual_seed(0)
    tiny = Configurable(model="tiny", dim=12).eval()
    torch.save(tiny.state_dict(), d / "tiny.pt")
    mlp, ema = MLP().eval(), MLP().eval()
    with torch.no_grad():
        for p in ema.parameters():
            p.mul_(0.5)
    opt = torch.optim.Adam(mlp.parameters())
    mlp(torch.randn(2, 32)).sum().backward()
    opt.step()
    state = mlp.state_dict()
    torch.save({"model_state": state, "optimizer_state": opt.state_dict(), "step": 42}, d / "train.pt")
    torch.save({"checkpoint": {"model": {f"module.{k}": v for k, v in state.items()}, "epoch": 3}}, d / "parallel.pt")
    torch.save({"model": state, "ema": ema.state_dict(), "step": 7}, d / "ema.pt")
    return d, tiny, mlp, ema


def spec(path, **kw):
    kw.setdefault("inputs", [parse_input_spec("x:batch,32")])
    return SourceSpec(path=Path(path), **kw)


def out(module, x):
    with torch.no_grad():
        return module(torch.from_numpy(x)).numpy()


# --- another configuration of the class: exit 2 with what differs, --arch-args to build it ---------

def test_checkpoint_of_another_configuration_is_exit_2_naming_the_mismatches(cli, files, tmp_path):
    d, tiny, _, _ = files
    r = cli("convert", d / "tiny.pt", "--arch", ARCH, "--trust", "--input", "x:batch,12", "-o", tmp_path / "o")
    assert r.exit_code == 2, r  # was 1: torch's "Error(s) in loading state_dict" escaped as a crash
    err = r.stderr.strip()
    assert len(err.splitlines()) == 1 and "tiny.pt" in err and "does not fit --arch" in err
    assert "fc1.weight checkpoint [8, 12] vs model [16, 32]" in err and "size mismatch" in err
    assert "--arch-args" in err and "takes model, dim, bias" in err
    assert not (tmp_path / "o").exists()


def test_arch_args_build_the_checkpoints_configuration_and_are_reported(cli, files, tmp_path):
    d, tiny, _, _ = files
    r = cli("convert", d / "tiny.pt", "--arch", ARCH, "--arch-args", "model=tiny,dim=12", "--trust", "--input", "x:batch,12",
            "-o", tmp_path / "o", "--json")
    assert r.exit_code == 0, r
    report = r.json()
    assert report["source"]["arch"] == ARCH and report["source"]["arch_args"] == {"model": "tiny", "dim": 12}
    assert all(p["ok"] for p in report["parity"])
    # the weights are the checkpoint's: the module load_module builds gives the tiny model's numbers
    module, _, _ = load_module(d / "tiny.pt", spec(d / "tiny.pt", arch=ARCH, trust=True, arch_args={"model": "tiny", "dim": 12}))
    x = np.random.default_rng(0).standard_normal((3, 12)).astype(np.float32)
    np.testing.assert_allclose(out(module, x), out(tiny, x), rtol=1e-6)


def test_bad_arch_args_are_exit_2_in_one_line(cli, files, tmp_path):
    d, _, _, _ = files
    common = ("--trust", "--input", "x:batch,12", "-o", tmp_path / "o")
    for args, words in ((("--arch", ARCH, "--arch-args", "model"), "bad --arch-args 'model'"),
                        (("--arch", ARCH, "--arch-args", "1x=2"), "bad --arch-args '1x=2'"),
                        (("--arch", ARCH, "--arch-args", "depth=3"), "--arch-args depth: --arch " + ARCH + " has no such parameter "
                                                                     "(it takes model, dim, bias)"),
                        (("--arch", ARCH, "--arch-args", "model=huge"), "cannot build --arch '" + ARCH + "' with --arch-args "
                                                                        "model=huge: KeyError"),
                        (("--arch", "zoo:mlp", "--arch-args", "dim=3"), "zoo:mlp has no such parameter (it takes no constructor arguments)"),
                        (("--arch-args", "dim=3"), "pass --arch too")):
        r = cli("convert", d / "tiny.pt", *args, *common)
        assert r.exit_code == 2 and words in r.stderr and len(r.stderr.strip().splitlines()) == 1, (args, r)
    assert not (tmp_path / "o").exists()


# --- the weights inside a training checkpoint --------------------------------------------------------

def test_training_checkpoint_weights_are_found_by_their_keys_and_said(cli, files, tmp_path):
    d, _, mlp, _ = files
    r = cli("convert", d / "train.pt", "--arch", "zoo:mlp", "--input", "x:batch,32", "-o", tmp_path / "o", "--json")
    assert r.exit_code == 0, r  # was exit 2: "expected a state dict of tensors, found dict"
    report = r.json()
    assert report["source"]["state_dict_key"] == "model_state"
    assert any("'model_state' entry" in w and "--state-dict-key model_state" in w for w in report["warnings"])
    assert "'model_state' entry" in r.stderr  # said on the terminal too
    shown = cli("inspect", d / "train.pt", "--json").json()
    assert shown["state_dict_key"] == "model_state" and shown["tensors"] == len(mlp.state_dict())
    x = np.random.default_rng(1).standard_normal((2, 32)).astype(np.float32)
    module, _, _ = load_module(d / "train.pt", spec(d / "train.pt", arch="zoo:mlp"))
    np.testing.assert_allclose(out(module, x), out(mlp, x), rtol=1e-6)  # the trained weights, not a fresh init


def test_nested_two_levels_with_a_dataparallel_prefix(files):
    d, _, mlp, _ = files
    module, _, _ = load_module(d / "parallel.pt", spec(d / "parallel.pt", arch="zoo:mlp"))
    assert module.checkpoint_entry["state_dict_key"] == "checkpoint.model"
    assert module.checkpoint_entry["state_dict_prefix_removed"] == "module."
    x = np.ones((2, 32), np.float32)
    np.testing.assert_allclose(out(module, x), out(mlp, x), rtol=1e-6)


def test_two_state_dicts_that_fit_are_ambiguous_until_one_is_named(files):
    d, _, mlp, ema = files
    with pytest.raises(BadInputError, match=r"2 state dicts that fit --arch zoo:mlp: model, ema .*--state-dict-key"):
        load_module(d / "ema.pt", spec(d / "ema.pt", arch="zoo:mlp"))
    x = np.ones((2, 32), np.float32)
    for key, want in (("ema", ema), ("model", mlp)):
        module, _, _ = load_module(d / "ema.pt", spec(d / "ema.pt", arch="zoo:mlp", state_dict_key=key))
        np.testing.assert_allclose(out(module, x), out(want, x), rtol=1e-6)
        assert "warnings" not in module.checkpoint_entry  # named by the user: nothing to say
    with pytest.raises(BadInputError, match=r"--state-dict-key 'weights' is not in the checkpoint \(its keys: \['ema', 'model', 'step'\]\)"):
        load_module(d / "ema.pt", spec(d / "ema.pt", arch="zoo:mlp", state_dict_key="weights"))
    with pytest.raises(BadInputError, match="'step' is not a dict of tensors"):
        load_module(d / "ema.pt", spec(d / "ema.pt", arch="zoo:mlp", state_dict_key="step"))
