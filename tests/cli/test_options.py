"""Each option is declared once, with help text, in the module that owns it; choice lists come
from the registry or options class that checks them."""

from __future__ import annotations

from pathlib import Path

import pytest

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
    from modelport.emitters import EMITTERS
    from modelport.emitters import tflite_options as tflite
    from modelport.emitters.routes import ROUTES
    from modelport.packaging import PACKAGERS
    assert options.ROUTES == ROUTES
    for command in ("convert", "emit"):
        assert ", ".join(EMITTERS) in _help_of(command, "--to")
        assert ", ".join(tflite.IO_DTYPES) in _help_of(command, "--tflite-io-dtype")
        assert " or ".join(tflite.LAYOUTS) in _help_of(command, "--tflite-layout")
        assert ", ".join(options.EMIT_PRECISIONS) in _help_of(command, "--precision")
    assert ", ".join(PACKAGERS) in _help_of("package", "--for")
    assert ", ".join(options.PRECISIONS) in _help_of("optimize", "--precision")


SHARED = ("--json", "--quiet", "--force", "--seed", "--dim", "--atol", "--rtol", "--min-cosine", "--calibration",
          "--accuracy-budget", "--strict", "--allow-precision-fallback", "--layout", "--mean", "--std", "--scale",
          "--channel-order", "--to")


@pytest.mark.parametrize("flag", SHARED)
def test_shared_flags_are_declared_once(flag):
    """In cli/options.py; the command modules use its annotations."""
    where = {p.name: p.read_text().count(f'"{flag}"') for p in CLI.glob("*.py") if p.name != "help.py"}  # help.py: panels, not declarations
    assert {k: v for k, v in where.items() if v} == {"options.py": 1}


def test_target_flags_are_declared_by_their_options_class():
    """A target's flag is spelled once, in its options class's module (the descriptor's `options`),
    and the command line builds it from there: no command module names it."""
    from modelport import targets
    src = CLI.parent
    flags = targets.flags()
    assert {f.flag for f in flags} >= {"--plan-only", "--tflite-layout", "--tflite-io-dtype", "--trt-shapes", "--workspace",
                                       "--executorch-backend"}
    for f in flags:
        where = {str(p.relative_to(src)): p.read_text().count(f'"{f.flag}"') for p in src.rglob("*.py")}
        owner = targets.get(f.target).options.partition(":")[0].removeprefix("modelport.").replace(".", "/") + ".py"
        assert {k: v for k, v in where.items() if v} == {owner: 1}, f.flag
        assert f.help and f.flag in _help_of("convert", f.flag) or _help_of("convert", f.flag) == f.help


def test_precision_is_declared_per_choice_list():
    """convert/emit (with TensorRT's best) and optimize share options.py's two; validate's picks default tolerances."""
    where = {p.name: p.read_text().count('"--precision"') for p in CLI.glob("*.py") if p.name != "help.py"}
    assert {k: v for k, v in where.items() if v} == {"options.py": 2, "validate.py": 1}
