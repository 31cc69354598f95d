"""Each option is declared once, with help text, in the module that owns it; choice lists come
from the registry or options class that checks them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from modelport.errors import BadInputError

CLI = Path(__file__).resolve().parents[2] / "src" / "modelport" / "cli"


def _commands():
    import typer.main

    from modelport.cli import app

    def walk(cmd, path):
        if hasattr(cmd, "commands"):
            for name, sub in cmd.commands.items():
                yield from walk(sub, [*path, name])
        else:
            yield " ".join(path), cmd

    yield from walk(typer.main.get_command(app), [])


def test_every_option_of_every_command_has_help():
    missing = [f"{name} {p.opts[0]}" for name, cmd in _commands() for p in cmd.params
               if p.param_type_name == "option" and not (p.help or "").strip()]
    assert missing == []


def _help_of(command: str, flag: str) -> str:
    cmd = dict(_commands())[command]
    return next(p.help for p in cmd.params if p.param_type_name == "option" and flag in p.opts)


def test_choice_lists_in_help_equal_their_owners():
    from modelport.cli import options
    from modelport.emitters import EMITTERS, tflite
    from modelport.serving import PACKAGERS

    assert options.TFLITE_LAYOUTS == tflite.LAYOUTS and options.TFLITE_IO_DTYPES == tflite.IO_DTYPES
    for command in ("convert", "emit"):
        assert ", ".join(EMITTERS) in _help_of(command, "--to")
        assert ", ".join(tflite.IO_DTYPES) in _help_of(command, "--tflite-io-dtype")
        assert " or ".join(tflite.LAYOUTS) in _help_of(command, "--tflite-layout")
        assert ", ".join(options.EMIT_PRECISIONS) in _help_of(command, "--precision")
    assert ", ".join(PACKAGERS) in _help_of("package", "--for")
    assert ", ".join(options.PRECISIONS) in _help_of("optimize", "--precision")


SHARED = ("--json", "--quiet", "--force", "--seed", "--dim", "--atol", "--rtol", "--min-cosine", "--calibration",
          "--accuracy-budget", "--strict", "--allow-precision-fallback", "--layout", "--mean", "--std", "--scale",
          "--channel-order", "--plan-only", "--tflite-layout", "--tflite-io-dtype", "--trt-shapes", "--workspace", "--to")


@pytest.mark.parametrize("flag", SHARED)
def test_shared_flags_are_declared_once(flag):
    """In cli/options.py; the command modules use its annotations."""
    where = {p.name: p.read_text().count(f'"{flag}"') for p in CLI.glob("*.py")}
    assert {k: v for k, v in where.items() if v} == {"options.py": 1}


def test_precision_is_declared_per_choice_list():
    """convert/emit (with TensorRT's best) and optimize share options.py's two; validate's picks default tolerances."""
    where = {p.name: p.read_text().count('"--precision"') for p in CLI.glob("*.py")}
    assert {k: v for k, v in where.items() if v} == {"options.py": 2, "validate.py": 1}


@pytest.mark.parametrize(("make", "words"), [
    (lambda: __import__("modelport.emitters.tflite", fromlist=["x"]).TFLiteOptions(layout="nchw"),
     "--tflite-layout 'nchw': choose source or nhwc"),
    (lambda: __import__("modelport.emitters.tflite", fromlist=["x"]).TFLiteOptions(io_dtype="int4"),
     "--tflite-io-dtype 'int4': choose float32, int8 or uint8"),
    (lambda: __import__("modelport.emitters.tensorrt", fromlist=["x"]).TensorRTOptions(workspace=0),
     "--workspace must be a positive number of MiB"),
    (lambda: __import__("modelport.emitters.tensorrt", fromlist=["x"]).TensorRTOptions(shapes=["x:1x3"]),
     "expected NAME:MIN:OPT:MAX"),
    (lambda: __import__("modelport.optimize.pipeline", fromlist=["x"]).OptimizeOptions(int8_mode="semi"),
     "unknown INT8 mode 'semi'; known: dynamic, static"),
    (lambda: __import__("modelport.optimize.pipeline", fromlist=["x"]).OptimizeOptions(calibration_method="mean"),
     "unknown calibration method 'mean'; known: minmax, entropy, percentile, distribution"),
    (lambda: __import__("modelport.serving", fromlist=["x"]).PackageOptions(device="tpu"), "unknown device 'tpu'; known: cpu, gpu"),
    (lambda: __import__("modelport.serving", fromlist=["x"]).PackageOptions(postprocess="argmax"),
     "unknown postprocess 'argmax'; known: none, softmax, topk=K"),
])
def test_options_classes_check_their_own_values(make, words):
    """From the Python API as from the CLI: the same class, the same exit-2 message."""
    with pytest.raises(BadInputError, match=re.escape(words)):
        make()


def test_options_are_frozen_and_normalised():
    import dataclasses

    from modelport.emitters.tensorrt import TensorRTOptions
    from modelport.emitters.tflite import TFLiteOptions
    from modelport.optimize.pipeline import OptimizeOptions
    from modelport.serving import PackageOptions

    opts = TFLiteOptions(layout="NHWC", io_dtype="UINT8")
    assert (opts.layout, opts.io_dtype) == ("nhwc", "uint8")
    assert TensorRTOptions(shapes="x:1x3:2x3:4x3").shapes == ("x:1x3:2x3:4x3",)
    assert OptimizeOptions(level="ALL", precision="int8-static").level == "all"
    assert PackageOptions(device="GPU").device == "gpu"
    for o in (opts, TensorRTOptions(), OptimizeOptions(), PackageOptions()):
        with pytest.raises(dataclasses.FrozenInstanceError):
            o.force = True


def test_convert_options_compose_the_stage_options():
    from modelport.emitters.tflite import TFLiteOptions
    from modelport.optimize.pipeline import OptimizeOptions
    from modelport.orchestration import ConvertOptions

    opts = ConvertOptions(targets="onnx,tflite", optimize="all", tflite=TFLiteOptions(layout="nhwc"), atol=1e-5)
    assert opts.optimize.level == "all" and opts.emitter_options("tflite").layout == "nhwc" and opts.emitter_options("onnx") is None
    assert opts.package.trust  # packaging inside convert may trace the PyTorch code the run just emitted
    with pytest.raises(BadInputError, match="set precision, calibration, strict and allow_precision_fallback on ConvertOptions"):
        ConvertOptions(optimize=OptimizeOptions(precision="fp16"))
    with pytest.raises(BadInputError, match="unknown optimisation level 'max'"):
        ConvertOptions(optimize="max")
