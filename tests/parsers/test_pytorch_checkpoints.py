"""Checkpoints as people save them: another configuration of the --arch class (--arch-args), the
weights nested in a training checkpoint (found by their keys, or --state-dict-key), DataParallel's
`module.` prefix, and two candidates that both fit; a Lightning checkpoint's pickled objects
(exit 3, loaded only with --trust), and keys under a prefix on either side (removed or added)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import numpy as np
import pytest
import torch
from torch import nn

from modelport.errors import BadInputError
from modelport.parsers.pytorch import load_module
from modelport.resolve.specs import SourceSpec, parse_input_spec
from modelport.validation.report import SCHEMA_FILE
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


# --- a Lightning-style checkpoint: pickled objects beside the weights, loaded only with --trust --------

class TrainingHParams:
    """A training script's own hyper-parameter object: unpickling it runs `_rebuild_hparams`, which
    writes a marker file, so a test sees whether the checkpoint's pickled code ran."""

    def __init__(self, marker, lr: float):
        self.marker, self.lr = str(marker), lr

    def __reduce__(self):
        return (_rebuild_hparams, (self.marker, self.lr))


def _rebuild_hparams(marker, lr):
    Path(marker).write_text("the checkpoint's pickled code ran")
    return TrainingHParams(marker, lr)


@pytest.fixture
def lightning(tmp_path):
    """A checkpoint as Lightning saves one: the LightningModule's weights under `model.`, the
    optimizer's state, and hyper-parameters that are no tensors (an argparse.Namespace, an object
    of the script's own class)."""
    import argparse

    torch.manual_seed(3)
    mlp = MLP().eval()
    opt = torch.optim.Adam(mlp.parameters())
    mlp(torch.randn(2, 32)).sum().backward()
    opt.step()
    marker = tmp_path / "marker"
    path = tmp_path / "epoch=3-step=120.ckpt"
    torch.save({"epoch": 3, "global_step": 120, "pytorch-lightning_version": "2.4.0",
                "state_dict": {f"model.{k}": v for k, v in mlp.state_dict().items()},
                "optimizer_states": [opt.state_dict()], "lr_schedulers": [], "hparams_name": "kwargs",
                "hyper_parameters": argparse.Namespace(lr=1e-3, hidden=64),
                "datamodule_hyper_parameters": TrainingHParams(marker, 1e-3)}, path)
    return path, marker, mlp


def test_lightning_checkpoint_is_exit_3_without_trust_and_runs_nothing(cli, lightning, tmp_path):
    path, marker, _ = lightning
    for arch in ("zoo:mlp", "modelport.zoo_builders.pytorch:MLP"):
        r = cli("convert", path, "--arch", arch, "--input", "x:batch,32", "-o", tmp_path / "o")
        assert r.exit_code == 3, (arch, r)
        err = r.stderr.strip()
        assert "unsafe pickle global, refusing to load" in err and path.name in err, err
        assert "--trust loads it" in err, err  # was: "a plain state dict loads without --trust", nothing on --trust
        assert not marker.exists() and not (tmp_path / "o").exists()


def test_lightning_checkpoint_loads_with_trust_and_says_so(cli, lightning, tmp_path):
    path, marker, mlp = lightning
    r = cli("convert", path, "--arch", "zoo:mlp", "--trust", "--input", "x:batch,32", "-o", tmp_path / "o", "--json")
    assert r.exit_code == 0, r  # was exit 3 even with --trust: "unsafe pickle global, refusing to load"
    report = r.json()
    assert marker.exists()  # --trust is what let the checkpoint's own code run
    assert report["source"]["state_dict_key"] == "state_dict" and report["source"]["state_dict_prefix_removed"] == "model."
    warnings = "\n".join(report["warnings"])
    assert "loaded with --trust (torch.load weights_only=False)" in warnings and "argparse.Namespace" in warnings
    assert "the prefix 'model.' was removed from the checkpoint's keys to fit --arch zoo:mlp" in warnings
    assert report["parity"] and all(p["ok"] for p in report["parity"])
    module, _, _ = load_module(path, spec(path, arch="zoo:mlp", trust=True))
    x = np.random.default_rng(2).standard_normal((2, 32)).astype(np.float32)
    np.testing.assert_allclose(out(module, x), out(mlp, x), rtol=1e-6)  # the checkpoint's weights


def test_a_plain_state_dict_with_trust_still_loads_weights_only(files, monkeypatch):
    """--trust allows weights_only=False; it is used only when the weights-only reader refuses the file."""
    d, _, mlp, _ = files
    calls = []
    real = torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **kw: calls.append(kw.get("weights_only")) or real(*a, **kw))
    module, _, _ = load_module(d / "train.pt", spec(d / "train.pt", arch="zoo:mlp", trust=True))
    assert calls == [True]
    assert not any("--trust" in w for w in module.checkpoint_entry.get("warnings", []))


# --- keys under a prefix on either side: removed or added when that makes every key fit ----------------

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class Wrapped(nn.Module):
    """Net's keys under `net.`, as a wrapper or LightningModule holds it."""

    def __init__(self):
        super().__init__()
        self.net = Net()

    def forward(self, x):
        return self.net(x)


class DeepWrapped(nn.Module):
    """Net's keys under two levels, `model.net.`."""

    def __init__(self):
        super().__init__()
        self.model = Wrapped()

    def forward(self, x):
        return self.model(x)


class WrappedWithHead(nn.Module):
    """`net.` plus keys of its own: no prefix makes a bare Net checkpoint fit."""

    def __init__(self):
        super().__init__()
        self.net = Net()
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        return self.head(self.net(x))


@pytest.fixture(scope="module")
def net():
    torch.manual_seed(5)
    return Net().eval()


@pytest.mark.parametrize(("saved", "arch", "said", "entry"), [
    ("model.", "Net", "the prefix 'model.' was removed from the checkpoint's keys to fit --arch {arch}",
     {"state_dict_prefix_removed": "model."}),
    ("encoder.module.", "Net", "the prefix 'encoder.module.' was removed from the checkpoint's keys to fit --arch {arch}",
     {"state_dict_prefix_removed": "encoder.module."}),
    ("", "Wrapped", "the prefix 'net.' was added to the checkpoint's keys to fit --arch {arch}",
     {"state_dict_prefix_added": "net."}),
    ("", "DeepWrapped", "the prefix 'model.net.' was added to the checkpoint's keys to fit --arch {arch}",
     {"state_dict_prefix_added": "model.net."}),
    ("model.", "Wrapped", "the prefix 'model.' of the checkpoint's keys was replaced by 'net.' to fit --arch {arch}",
     {"state_dict_prefix_removed": "model.", "state_dict_prefix_added": "net."}),
])
def test_prefixed_keys_are_fitted_to_the_arch_and_said(cli, net, tmp_path, saved, arch, said, entry):
    path = tmp_path / "weights.pt"
    torch.save({f"{saved}{k}": v for k, v in net.state_dict().items()}, path)
    arch = f"{__name__}:{arch}"
    r = cli("convert", path, "--arch", arch, "--trust", "--input", "x:batch,8", "-o", tmp_path / "o", "--json")
    assert r.exit_code == 0, r  # adding was exit 2: "the state dict does not fit --arch ...: 4 missing key(s) ..."
    report = r.json()
    assert said.format(arch=arch) in report["warnings"], report["warnings"]
    assert {k: report["source"].get(k) for k in entry} == entry
    assert {"state_dict_prefix_removed", "state_dict_prefix_added"} - set(entry) == \
        {"state_dict_prefix_removed", "state_dict_prefix_added"} - set(report["source"])
    jsonschema.Draft202012Validator(json.loads(SCHEMA_FILE.read_text())).validate(report)
    assert report["parity"] and all(p["ok"] for p in report["parity"])
    module, _, _ = load_module(path, spec(path, arch=arch, trust=True, inputs=[parse_input_spec("x:batch,8")]))
    x = np.random.default_rng(4).standard_normal((3, 8)).astype(np.float32)
    np.testing.assert_allclose(out(module, x), out(net, x), rtol=1e-6)  # the checkpoint's weights, not a fresh init


def test_a_prefix_that_does_not_make_every_key_fit_is_not_applied(cli, net, tmp_path):
    path = tmp_path / "weights.pt"
    torch.save(net.state_dict(), path)
    arch = f"{__name__}:WrappedWithHead"
    r = cli("convert", path, "--arch", arch, "--trust", "--input", "x:batch,8", "-o", tmp_path / "o")
    assert r.exit_code == 2, r
    err = r.stderr.strip()
    assert f"does not fit --arch {arch}" in err and "6 missing key(s) (net.fc1.weight" in err, err
    assert "4 unexpected key(s) (fc1.weight" in err, err
    assert not (tmp_path / "o").exists()


# --- the network under one prefix beside state of its own (a LightningModule's `encoder.` and `shift`) ---

def _lightning_with(state: dict, path: Path) -> Path:
    """A checkpoint as Lightning saves a LightningModule holding its network as one attribute."""
    torch.save({"epoch": 7, "global_step": 700, "pytorch-lightning_version": "2.4.0", "state_dict": state,
                "optimizer_states": [], "lr_schedulers": [], "hparams_name": "kwargs",
                "hyper_parameters": {"lr": 1e-3, "bins_per_semitone": 3}}, path)
    return path


@pytest.mark.parametrize(("arch", "prefix", "beside", "added"), [
    ("Net", "encoder.", {"shift": torch.tensor(0.25)}, ""),
    ("Net", "model.encoder.", {"model.shift": torch.tensor(0.25), "model.head.weight": torch.ones(2, 4)}, ""),
    ("Wrapped", "encoder.", {"shift": torch.tensor(0.25), "crop_cqt": torch.zeros(3)}, "net."),
])
def test_the_network_under_one_prefix_is_taken_and_the_rest_said(cli, net, tmp_path, arch, prefix, beside, added):
    state = {**{f"{prefix}{k}": v for k, v in net.state_dict().items()}, **beside}
    path = _lightning_with(state, tmp_path / "pesto.ckpt")
    arch = f"{__name__}:{arch}"
    r = cli("convert", path, "--arch", arch, "--trust", "--input", "x:batch,8", "-o", tmp_path / "o", "--json")
    assert r.exit_code == 0, r  # was exit 2: "does not fit --arch: 4 missing key(s) …; 5 unexpected key(s) …"
    report = r.json()
    left_out = list(beside)  # in the checkpoint's order
    said = next((w for w in report["warnings"] if f"keys under the prefix '{prefix}' were taken" in w), None)
    assert said is not None, report["warnings"]
    assert f"to fit --arch {arch}" in said and f"{len(left_out)} key(s) of the checkpoint left out: {', '.join(left_out)}" in said
    assert (f"the prefix '{added}' added" in said) == bool(added)
    assert f"'{prefix}'" in r.stderr and left_out[0] in r.stderr  # said on the terminal too
    source = report["source"]
    assert source["state_dict_key"] == "state_dict" and source["state_dict_prefix_removed"] == prefix
    assert source["state_dict_keys_left_out"] == left_out
    assert source.get("state_dict_prefix_added") == (added or None)
    jsonschema.Draft202012Validator(json.loads(SCHEMA_FILE.read_text())).validate(report)
    assert report["parity"] and all(p["ok"] for p in report["parity"])
    module, _, _ = load_module(path, spec(path, arch=arch, trust=True, inputs=[parse_input_spec("x:batch,8")]))
    assert module.checkpoint_entry["state_dict_keys_left_out"] == left_out
    x = np.random.default_rng(6).standard_normal((3, 8)).astype(np.float32)
    np.testing.assert_allclose(out(module, x), out(net, x), rtol=1e-6)  # the checkpoint's weights, not a fresh init


def test_two_prefixes_that_both_hold_the_network_are_exit_2_naming_both(cli, net, tmp_path):
    teacher = {f"teacher.{k}": v * 2 for k, v in net.state_dict().items()}
    state = {**{f"student.{k}": v for k, v in net.state_dict().items()}, **teacher, "shift": torch.tensor(0.0)}
    path = _lightning_with(state, tmp_path / "distill.ckpt")
    arch = f"{__name__}:Net"
    r = cli("convert", path, "--arch", arch, "--trust", "--input", "x:batch,8", "-o", tmp_path / "o")
    assert r.exit_code == 2, r
    err = r.stderr.strip()
    assert len(err.splitlines()) == 1 and path.name in err, err
    assert f"2 prefixes that each fit --arch {arch}: 'student.', 'teacher.'" in err, err
    assert not (tmp_path / "o").exists()


def test_no_prefix_holding_the_whole_network_is_still_a_misfit_naming_the_closest(cli, net, tmp_path):
    """`encoder.` lacks fc2.bias: taking it would leave the model half-initialised, so nothing is taken."""
    state = {f"encoder.{k}": v for k, v in net.state_dict().items() if k != "fc2.bias"}
    path = _lightning_with({**state, "decoder.fc2.bias": net.fc2.bias.detach(), "shift": torch.tensor(0.25)},
                           tmp_path / "split.ckpt")
    arch = f"{__name__}:Net"
    r = cli("convert", path, "--arch", arch, "--trust", "--input", "x:batch,8", "-o", tmp_path / "o")
    assert r.exit_code == 2, r
    err = r.stderr.strip()
    assert len(err.splitlines()) == 1 and path.name in err, err
    assert f"does not fit --arch {arch}" in err and "4 missing key(s)" in err and "5 unexpected key(s)" in err, err
    assert "closest: the 3 key(s) under the prefix 'encoder.' hold 3 of the architecture's 4" in err, err
    assert not (tmp_path / "o").exists()
