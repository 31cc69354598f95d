"""`modelport repo list|add|promote|rollback`: edit a served repository (Triton's layout)."""

from __future__ import annotations

from pathlib import Path

import typer

from modelport.cli import options as flags
from modelport.cli._common import console, print_rows, run


def register(app: typer.Typer) -> None:
    repo_app = typer.Typer(help="Edit a served repository: add a version, promote it, roll back.", no_args_is_help=True)
    app.add_typer(repo_app, name="repo")

    def _said(data: dict) -> None:
        console.print(f"{data['model']}: serving {data['serving']}"
                      + (f" (was {data['previous']})" if data.get("previous") is not None else "")
                      + (f"; added version {data['version']}" if "version" in data else ""), markup=False)

    @repo_app.command("list")
    def list_cmd(repo: str = typer.Argument(..., help="The repository: a folder or s3://bucket/prefix."), json_out: flags.JsonOut = False,
                 quiet: flags.Quiet = False):
        """Every model, its versions and the ones that serve."""

        def body():
            from modelport.serving.repository_edit import listing, on_repository

            return on_repository(repo, listing, edits=False)

        def show(data):
            print_rows("repository", ["model", "versions", "serving"],
                       [[m["name"], ",".join(map(str, m["versions"])), ",".join(map(str, m["serving"]))] for m in data["models"]])

        run(body, command="repo list", json_out=json_out, quiet=quiet, print_result=show)

    @repo_app.command("add")
    def add_cmd(repo: str = typer.Argument(..., help="The repository: a folder (made if missing) or s3://bucket/prefix."),
                name: str = typer.Argument(..., help="The model's name in it."),
                source: str = typer.Argument(..., help="A convert output folder, a package version folder or a model file."),
                version: int | None = typer.Option(None, "--version", help="The version number (default: the next)."),
                json_out: flags.JsonOut = False, quiet: flags.Quiet = False):
        """Add a version beside the others; it serves only once promoted (the first version serves at once)."""

        def body():
            from modelport.serving.repository_edit import add, on_repository

            source_path = Path(source)
            return on_repository(repo, lambda folder: add(folder, name, source_path, version), create=True)

        run(body, command="repo add", json_out=json_out, quiet=quiet, render=_said)

    @repo_app.command("promote")
    def promote_cmd(repo: str = typer.Argument(..., help="The repository: a folder or s3://bucket/prefix."), name: str = typer.Argument(..., help="The model."),
                    version: int = typer.Argument(..., help="The version to serve."), json_out: flags.JsonOut = False,
                    quiet: flags.Quiet = False):
        """Serve VERSION of the model (a running server picks it up: poll, or its load route)."""

        def body():
            from modelport.serving.repository_edit import on_repository, promote

            return on_repository(repo, lambda folder: promote(folder, name, version))

        run(body, command="repo promote", json_out=json_out, quiet=quiet, render=_said)

    @repo_app.command("rollback")
    def rollback_cmd(repo: str = typer.Argument(..., help="The repository: a folder or s3://bucket/prefix."), name: str = typer.Argument(..., help="The model."),
                     json_out: flags.JsonOut = False, quiet: flags.Quiet = False):
        """Serve the version(s) served before the last promote."""

        def body():
            from modelport.serving.repository_edit import on_repository, rollback

            return on_repository(repo, lambda folder: rollback(folder, name))

        run(body, command="repo rollback", json_out=json_out, quiet=quiet, render=_said)
