"""The `modelport` command line: a root typer app with one small module per command.

Nothing heavy is imported here: `modelport --help` must stay instant.
"""

from __future__ import annotations

import typer

from modelport.cli import lean_rich
from modelport.version import __version__

lean_rich.load()  # before typer imports it itself

app = typer.Typer(
    name="modelport",
    help="Convert, optimise, validate and package deep-learning models.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    add_completion=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool):
    if value:
        typer.echo(f"modelport {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit.")):
    """Convert, optimise, validate and package deep-learning models."""


def _register() -> None:
    # One line per command module; each module adds its command(s) to `app`.
    from modelport.cli import batch, bench, convert, doctor, emit, inspect, optimize, package, repo, report, serve, validate, zoo

    for module in (convert, inspect, zoo, optimize, package, serve, repo, emit, validate, bench, doctor, batch, report):
        module.register(app)
    from modelport.cli.help import polish

    polish(app)


_register()


def main() -> None:
    from modelport.deps import quiet_framework_logs

    quiet_framework_logs()  # before anything imports TensorFlow; children inherit the environment
    app(prog_name="modelport")
