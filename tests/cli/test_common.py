"""What every command shares: choice options checked up front, list flags that accumulate, one
JSON document on stdout whatever the libraries print, one error line on stderr whatever
TensorFlow logs, and a live display that names the stage really running."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]


def _onnx(path: Path, *, custom: bool = False) -> Path:
    """y = x @ w (x [batch, 8]); with `custom`, a com.microsoft Gelu after it."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"])]
    nodes += [helper.make_node("Gelu", ["m"], ["y"], domain="com.microsoft")] if custom else [helper.make_node("Relu", ["m"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])], initializer=[w])
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid("com.microsoft", 1)] if custom else [])
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    import modelport
    from modelport.zoo_builders import save_source

    root = tmp_path_factory.mktemp("common")
    _onnx(root / "onnx" / "m.onnx")
    _onnx(root / "ms" / "ms.onnx", custom=True)
    save_source("mlp", root / "mlp")
    save_source("keras_cnn", root / "keras")
    modelport.convert(root / "onnx" / "m.onnx", root / "conv", targets="onnx")
    # an architecture module that chats on stdout when imported, from Python and from C level
    (root / "arch").mkdir()
    (root / "arch" / "chatty_arch.py").write_text(
        "import os, sys\nprint('chatty: loading architecture')\nsys.stdout.flush()\nos.write(1, b'chatty: C-level line\\n')\n"
        "from modelport.zoo_builders.pytorch import MLP as Net\n")
    return root


# --- point 16: every choice option of every command ---------------------------------------------

def _base(files: Path, out: Path) -> dict[str, list]:
    onnx_file = files / "onnx" / "m.onnx"
    return {"convert": ["convert", onnx_file, "-o", out], "optimize": ["optimize", onnx_file, "-o", out],
            "emit": ["emit", onnx_file, "--to", "onnx", "-o", out], "validate": ["validate", onnx_file, onnx_file],
            "package": ["package", files / "conv", "--for", "triton", "-o", out]}


CHOICES = [  # command, option, a bad value, the words of the message
    ("convert", "--to", "onnx,foo", "unknown target 'foo'; known: onnx, pytorch, tflite, tensorrt, ort"),
    ("convert", "--from", "foo", "unknown source framework 'foo'; known: onnx, paddle, caffe, darknet, pytorch"),
    ("convert", "--optimize", "max", "unknown optimisation level 'max'; known: none, basic, extended, all, auto"),
    ("convert", "--precision", "int9", "unknown precision 'int9'; known: fp32, fp16, int8, int4, auto, best"),
    ("convert", "--tflite-layout", "nchw", "unknown --tflite-layout 'nchw'; known: source, nhwc"),
    ("convert", "--executorch-backend", "vulkan", "unknown ExecuTorch backend 'vulkan'; known: xnnpack, portable"),
    ("convert", "--tflite-io-dtype", "int4", "unknown --tflite-io-dtype 'int4'; known: float32, int8, uint8"),
    ("convert", "--package", "tritonx", "unknown serving system 'tritonx'; known:"),
    ("convert", "--route", "sideways", "unknown route 'sideways'; known: auto, native, onnx"),
    ("convert", "--task", "summarise", "unknown task 'summarise'; known: feature-extraction, text-classification"),
    ("convert", "--layout", "XYZ", "unknown --layout 'XYZ'; known:"),
    ("convert", "--channel-order", "GBR", "bad --channel-order 'GBR'"),
    ("convert", "--range", "40,-100", "bad --range '40,-100': expected LOW,HIGH with LOW < HIGH"),
    ("convert", "--reference", "fp32", "unknown --reference 'fp32'; known: auto, transformers, streamed"),
    ("convert", "--runtimes", "onnxruntime,tensorflow", "unknown runtime 'tensorflow' for --runtimes; known: onnxruntime, openvino"),
    ("optimize", "--level", "max", "unknown optimisation level 'max'; known:"),
    ("optimize", "--passes", "fold,foo", "unknown pass(es) 'foo'; known:"),
    ("optimize", "--precision", "int9", "unknown precision 'int9'; known: fp32, fp16, int8"),
    ("optimize", "--int8-mode", "semi", "unknown INT8 mode 'semi'; known: dynamic, static"),
    ("optimize", "--calibration-method", "mean", "unknown calibration method 'mean'; known: minmax, entropy, percentile, distribution"),
    ("optimize", "--layout", "XYZ", "unknown --layout 'XYZ'; known:"),
    ("optimize", "--channel-order", "GBR", "bad --channel-order 'GBR'"),
    ("emit", "--to", "foo", "unknown target 'foo'; known:"),
    ("emit", "--route", "sideways", "unknown route 'sideways'; known: auto, native, onnx"),
    ("emit", "--precision", "int9", "unknown precision 'int9'; known: fp32, fp16, int8, int4, auto, best"),
    ("emit", "--tflite-layout", "nchw", "unknown --tflite-layout 'nchw'; known: source, nhwc"),
    ("emit", "--executorch-backend", "vulkan", "unknown ExecuTorch backend 'vulkan'; known: xnnpack, portable"),
    ("emit", "--tflite-io-dtype", "int4", "unknown --tflite-io-dtype 'int4'; known: float32, int8, uint8"),
    ("validate", "--precision", "int9", "unknown precision 'int9'; known: fp32, fp16, int8"),
    ("package", "--for", "foo", "unknown serving system 'foo'; known: triton, torchserve, tfserving, k8s, kserve"),
    ("package", "--backend", "tflite", "unknown Triton backend 'tflite'; known: onnx, tensorrt, savedmodel, torchscript"),
    ("package", "--runtime", "jax", "unknown TorchServe runtime 'jax'; known: onnxruntime, torch"),
    ("package", "--device", "tpu", "unknown device 'tpu'; known: cpu, gpu"),
    ("package", "--postprocess", "argmax", "unknown postprocess 'argmax'; known: none, softmax, topk=K"),
    ("package", "--server", "nginx", "unknown server 'nginx'; known: triton, torchserve, tfserving"),
    ("package", "--scale-on", "memory", "unknown --scale-on metric 'memory'; known: cpu, pending-requests"),
]


@pytest.mark.parametrize(("command", "option", "value", "words"), CHOICES, ids=[f"{c}{o}" for c, o, _, _ in CHOICES])
def test_unknown_choice_is_exit_2_listing_the_known_values(cli, files, tmp_path, command, option, value, words):
    """Checked before any work, whether or not this run would use the option."""
    r = cli(*_base(files, tmp_path / "out")[command], option, value)
    assert r.exit_code == 2, r
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], r.stderr
    assert not (tmp_path / "out").exists()


def test_every_choice_option_is_covered():
    """The options above are every option of these commands that takes a value from a fixed set."""
    import typer.main

    from modelport.cli import app

    group = typer.main.get_command(app)
    free = {"-o", "--input", "--inputShape", "--output", "--arch", "--opset", "--atol", "--rtol", "--min-cosine", "--mean", "--std",
            "--scale", "--dim", "--seed", "--samples", "--arch-args", "--state-dict-key", "--signature", "--input-names", "--calibration", "--accuracy-budget", "--trt-shapes",
            "--workspace", "-in", "-iw", "--inputs", "--name", "--version", "--max-batch", "--preferred-batch", "--queue-delay-us",
            "--instances", "--image", "--replicas", "--min-replicas", "--max-replicas", "--cpu", "--memory", "--gpus", "--namespace",
            "--storage-uri", "--data", "--value", "--junit", "--new-tokens", "--block-size", "--stage-timeout", "--stage-memory",
            "--range", "--target-pending"}
    covered = {(c, o) for c, o, _, _ in CHOICES}
    for name in ("convert", "optimize", "emit", "validate", "package"):
        for param in group.commands[name].params:
            if param.param_type_name == "option" and not param.is_flag and not param.is_bool_flag:
                first = next((o for o in param.opts if o.startswith("--")), param.opts[0])
                if not (set(param.opts) & free):
                    assert (name, first) in covered, f"{name} {first}: a value option the choice test does not cover"


def test_repeated_list_flags_accumulate(cli, files, tmp_path):
    onnx_file = files / "onnx" / "m.onnx"
    r = cli("convert", onnx_file, "--to", "onnx", "--to", "ort", "-o", tmp_path / "a", "--json")
    assert r.exit_code == 0, r
    assert [a["target"] for a in r.json()["artifacts"]] == ["onnx", "ort"]
    r = cli("optimize", onnx_file, "--passes", "shape", "--passes", "dce,fold", "-o", tmp_path / "b", "--json")
    assert r.exit_code == 0, r
    assert [s["pass"] for s in r.json()["stages"] if "pass" in s] == ["shape", "dce", "fold"]
    r = cli("package", files / "conv", "--for", "triton", "--for", "kserve", "-o", tmp_path / "c", "--json")
    assert r.exit_code == 0, r
    assert [b["system"] for b in r.json()["bundles"]] == ["triton", "kserve"]
    r = cli("convert", onnx_file, "--output", "z", "--output", "extra", "-o", tmp_path / "d")
    assert r.exit_code == 2 and "['z', 'extra']" in r.stderr, r


# --- point 17: TensorFlow's log lines never reach stderr ----------------------------------------

@pytest.mark.parametrize("quiet", [True, False])
def test_failing_keras_conversion_prints_one_line(files, tmp_path, quiet):
    """Parity breach after tf2onnx ran (exit 4): TF, absl and oneDNN lines stay out of stderr.

    The environment is the user's, without the variables tests or shells may have set.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TF_", "GLOG_", "GRPC_", "MODELPORT_"))}
    env["PYTHONPATH"] = str(REPO / "src")
    args = ["convert", files / "keras" / "model.keras", "--min-cosine", "1.5", "-o", tmp_path / "out", *(["-q"] if quiet else [])]
    p = subprocess.run([sys.executable, "-m", "modelport", *map(str, args)], capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 4, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "parity failed" in lines[0], p.stderr


def test_quiet_tflite_run_prints_nothing(files, tmp_path):
    """LiteRT logs "Created TensorFlow Lite XNNPACK delegate" at INFO level when validation first
    allocates the interpreter: with --quiet a successful run's stderr is empty all the same."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TF_", "GLOG_", "GRPC_", "MODELPORT_"))}
    env["PYTHONPATH"] = str(REPO / "src")
    args = ["emit", files / "onnx" / "m.onnx", "--to", "tflite", "-o", tmp_path / "out", "-q"]
    p = subprocess.run([sys.executable, "-m", "modelport", *map(str, args)], capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0 and p.stderr == "", p.stderr


# --- point 18: --json stdout is one document --------------------------------------------------

def _json_cases(files: Path, out: Path) -> list[list]:
    return [
        ["convert", files / "mlp" / "model.pt2", "--input", "input:batch,32", "--to", "onnx", "-o", out],  # torch exporter
        ["convert", files / "mlp" / "model.safetensors", "--arch", "chatty_arch:Net", "--trust", "--input", "input:batch,32", "-o", out],  # prints at import
        ["convert", files / "keras" / "model.keras", "--optimize", "all", "-o", out],  # tf2onnx, onnxsim
        ["optimize", files / "ms" / "ms.onnx", "--level", "all", "-o", out],  # onnxsim on a com.microsoft op
        ["emit", files / "onnx" / "m.onnx", "--to", "tflite", "-o", out],  # onnx2tf
        ["package", files / "conv", "--for", "tfserving", "-o", out],  # onnx2tf, TensorFlow
        ["validate", files / "onnx" / "m.onnx", files / "conv" / "model.onnx"],
        ["inspect", files / "keras" / "model.keras"],
        ["zoo", "build", "keras_cnn", "-o", out],
        ["convert", files / "mlp" / "model.safetensors", "--arch", "chatty_arch:Net", "--trust", "--input", "input:batch,32", "--min-cosine", "1.5", "-o", out],
    ]


@pytest.mark.parametrize("case", range(10))
def test_json_stdout_is_exactly_one_document(cli_proc, files, tmp_path, case):
    args = _json_cases(files, tmp_path / "out")[case]
    env = {"PYTHONPATH": os.pathsep.join([str(files / "arch"), str(REPO / "src")])}
    r = cli_proc(*args, "--json", env=env)
    doc = json.loads(r.stdout)  # raises on anything before or after the document
    assert isinstance(doc, dict) and r.exit_code == doc.get("exit_code", 0), r
    assert r.exit_code == (4 if case == 9 else 0), r
    if case == 1:
        assert "chatty: loading architecture" in r.stderr and "chatty: C-level line" in r.stderr


# --- point 19: the live display names the running stage and its elapsed time ------------------

def _run_on_pty(args: list, timeout: float = 600) -> tuple[int, str]:
    """The CLI with stderr on a pseudo-terminal (as a user sees it); returns (exit code, what was drawn)."""
    from tests.terminal import run_on_terminal

    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "TERM": "xterm-256color", "COLUMNS": "160"}
    env.pop("NO_COLOR", None)
    code, text = run_on_terminal(args, stream="stderr", env=env, timeout=timeout)
    return code, re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)


def _stages_shown(text: str) -> list[tuple[str, str | None]]:
    shown: list[tuple[str, str | None]] = []
    for m in re.finditer(r"([a-z]+(?::[\w.\-() ]+?)?)(?: \(([^)]+)\))? (\d+\.\d)s", text):
        item = (m.group(1).strip(), m.group(2))
        if not shown or shown[-1] != item:
            shown.append(item)
    return shown


def _in_order(shown: list, wanted: list) -> bool:
    it = iter(shown)
    return all(any(w == s for s in it) for w in wanted)


def test_progress_names_each_stage_with_its_elapsed_time(files, tmp_path):
    out = tmp_path / "out"
    code, text = _run_on_pty(["convert", files / "mlp" / "model.pt2", "--input", "input:batch,32", "--to", "onnx,tflite", "-o", out])
    assert code == 0, text[-2000:]
    shown = _stages_shown(text)
    wanted = [("parse", "torch.onnx.export, dynamo"), ("validate:ir", None), ("emit:onnx", None), ("validate:onnx", None),
              ("emit:tflite", "onnx2tf"), ("validate:tflite", None)]
    assert _in_order(shown, wanted), shown
    code, text = _run_on_pty(["package", out, "--for", "triton,tfserving", "-o", tmp_path / "bundles"])
    assert code == 0, text[-2000:]
    assert _in_order(_stages_shown(text), [("load", None), ("package:triton", None), ("package:tfserving", None)]), text[-3000:]
    code, text = _run_on_pty(["validate", out / "model.onnx", out / "model.tflite"])
    assert code == 0, text[-2000:]
    assert _in_order(_stages_shown(text), [("run:model.onnx", "onnx"), ("run:model.tflite", "tflite")]), text[-3000:]
