"""`modelport zoo list|build|fetch`: the model zoo."""

from __future__ import annotations

from pathlib import Path

import typer

from modelport.cli import options as flags
from modelport.cli._common import console, print_rows, run


def register(app: typer.Typer) -> None:
    zoo_app = typer.Typer(help="The model zoo: list, build locally, or fetch (sha256-checked).", no_args_is_help=True)
    app.add_typer(zoo_app, name="zoo")

    @zoo_app.command("list")
    def list_cmd(json_out: flags.JsonOut = False, quiet: flags.Quiet = False):
        """List the zoo's models."""

        def body():
            from modelport import zoo
            return {"models": [
                {"name": e.name, "framework": e.framework, "inputs": e.inputs, "description": e.description,
                 "source": "download" if e.url else "build", "disabled": e.disabled}
                for e in zoo.load_zoo().values()
            ]}

        def print_models(data):
            rows = [[m["name"], m["framework"], " ".join(m["inputs"]), m["source"],
                     m["description"] + (f" [disabled: {m['disabled']}]" if m["disabled"] else "")] for m in data["models"]]
            print_rows("model zoo", ["name", "framework", "inputs", "source", "description"], rows)

        run(body, command="zoo list", json_out=json_out, quiet=quiet, print_result=print_models)

    @zoo_app.command("build")
    def build_cmd(
        name: str = typer.Argument(..., help="Zoo model name."),
        output: str = typer.Option(..., "-o", "--output-dir", help="Folder for the source model files."),
        force: flags.Force = False,
        json_out: flags.JsonOut = False,
        quiet: flags.Quiet = False,
    ):
        """Build a zoo model locally (seeded random weights) and save it in its source format."""

        def body():
            from modelport.zoo_builders import save_source

            return save_source(name, Path(output), force=force)

        def render(data):
            for f in data["files"]:
                console.print(f"[green]wrote[/] {f}")
            console.print(f"convert it with: modelport convert {data['convert_hint']}")

        run(body, json_out=json_out, quiet=quiet, render=render)

    @zoo_app.command("fetch")
    def fetch_cmd(
        name: str = typer.Argument(..., help="Zoo model name."),
        cache_dir: str | None = typer.Option(None, "--cache-dir", help="Cache folder (default: ~/.cache/modelport)."),
        json_out: flags.JsonOut = False,
        quiet: flags.Quiet = False,
    ):
        """Download a zoo model's file (sha256-verified) into the cache."""

        def body():
            from modelport import zoo
            cache = Path(cache_dir) if cache_dir else Path.home() / ".cache" / "modelport"
            return {"name": name, "path": str(zoo.fetch(name, cache, progress=not (quiet or json_out) and None))}

        run(body, json_out=json_out, quiet=quiet, render=lambda d: console.print(f"[green]fetched[/] {d['path']}"))
