"""`modelport batch MANIFEST -o OUT`: many models per run, resumable, with reports CI systems read."""

from __future__ import annotations

import typer

from modelport.cli import options as flags
from modelport.cli._common import console, run


def register(app: typer.Typer) -> None:
    @app.command("batch")
    def batch_cmd(
        manifest: str = typer.Argument(..., help="YAML manifest: `models:` (source, name, to, input, ...) and `defaults:`."),
        output: str = typer.Option(..., "-o", "--output-dir", help="Batch folder: OUT/<model>/ per model and OUT/summary.json."),
        jobs: int = typer.Option(1, "--jobs", "-j", help="Models converted at once on this machine (local executor)."),
        executor: str = typer.Option("local", "--executor", help="local (child processes here) or ray (Ray tasks)."),
        address: str | None = typer.Option(None, "--address", help="Ray cluster address (default: start a local one)."),
        rerun_failed: bool = typer.Option(False, "--rerun-failed", help="Run only the models whose last run failed."),
        only: list[str] = typer.Option([], "--only", help="Run only these models (comma-separated or repeated)."),
        emit: str | None = typer.Option(None, "--emit", help="k8s-job: write a Kubernetes Indexed Job for the manifest "
                                        "into OUT instead of running anything (--jobs is its parallelism)."),
        image: str | None = typer.Option(None, "--image", help="--emit k8s-job: the container image with modelport installed."),
        namespace: str | None = typer.Option(None, "--namespace", help="--emit k8s-job: the namespace of the Job and ConfigMap."),
        pvc: str | None = typer.Option(None, "--pvc", help="--emit k8s-job: the PersistentVolumeClaim mounted at /data "
                                       "(sources under /data/src, output /data/out; default modelport-batch)."),
        keep_failed: flags.KeepFailed = False,
        junit: flags.Junit = None,
        json_out: flags.JsonOut = False,
        quiet: flags.Quiet = False,
    ):
        """Convert every model of a manifest, each in its own process; unchanged models are skipped.

        Exit 4 when any model failed (its entry in summary.json says why); a failure never stops the others.
        """
        from pathlib import Path

        from modelport.cli._common import split_list

        def body():
            from modelport.errors import ValidationError
            from modelport.orchestration.batch import BatchOptions, run_batch
            from modelport.validation.ci_reports import junit_for_batch, publish_to_github

            def progress(entry):
                if not quiet and not json_out:
                    mark = "[green]ok[/]" if entry["status"] == "ok" else f"[red]{entry['status']}[/]"
                    console.print(f"{mark} {entry['name']} ({entry.get('seconds', 0):.1f} s)"
                                  + (f": {entry['error']}" if entry.get("error") else ""), soft_wrap=True, highlight=False)

            from modelport.orchestration.batch import EXECUTORS
            from modelport.registry import choice

            if emit is not None or image or namespace or pvc:
                return emit_job()
            options = BatchOptions(jobs=jobs, rerun_failed=rerun_failed, keep_failed=keep_failed, only=split_list(only),
                                   executor=choice(executor, EXECUTORS, "executor"), address=address)
            summary = run_batch(manifest, output, options, on_result=progress)
            if junit:
                junit_for_batch(summary, Path(output), junit)
            publish_to_github(summary["models"], f"modelport batch {Path(manifest).name}", lambda line: console.print(
                line, markup=False, highlight=False, soft_wrap=True))
            if summary["counts"]["failed"]:
                if not quiet and not json_out:
                    render(summary)
                failed = [m["name"] for m in summary["models"] if m.get("status") not in ("ok", "not-run")]
                raise ValidationError(f"{len(failed)} of {len(summary['models'])} model(s) failed: {', '.join(failed)}",
                                      path=Path(output) / "summary.json").with_report(summary)
            return summary

        def emit_job():
            from modelport.errors import BadInputError
            from modelport.orchestration.batch_k8s import K8sJobOptions, emit_k8s_job

            if emit is None:
                raise BadInputError("--image, --namespace and --pvc describe an emitted Job: add --emit k8s-job")
            if emit != "k8s-job":
                raise BadInputError(f"unknown --emit {emit!r}; known: k8s-job")
            clash = [flag for flag, used in (("--executor ray", executor != "local"), ("--address", address),
                                             ("--rerun-failed", rerun_failed), ("--only", only), ("--junit", junit)) if used]
            if clash:
                raise BadInputError(f"--emit k8s-job writes a Job and runs nothing: {', '.join(clash)} makes no sense with it")
            if not image:
                raise BadInputError("--emit k8s-job needs --image: a container image with modelport installed")
            return emit_k8s_job(manifest, output, K8sJobOptions(image=image, namespace=namespace, pvc=pvc or "modelport-batch",
                                                                jobs=jobs, keep_failed=keep_failed))

        def render(summary):
            from rich.table import Table

            if "completions" in summary:  # --emit k8s-job
                console.print(f"Indexed Job {summary['job']}: {summary['completions']} model(s), {summary['parallelism']} at once; "
                              f"index table {Path(output) / 'index.tsv'}; kubectl apply -f {output}", soft_wrap=True, highlight=False)
                return
            t = Table(title="batch", title_justify="left")
            for col in ("model", "status", "seconds", "targets", "note"):
                t.add_column(col, overflow="fold")
            for m in summary["models"]:
                note = "unchanged, skipped" if m.get("skipped") else (m.get("error") or "")
                t.add_row(m["name"], m["status"], f"{m.get('seconds') or 0:.1f}", ",".join(m.get("targets") or []), note)
            console.print(t)
            c = summary["counts"]
            console.print(f"{c['ok']} ok, {c['failed']} failed, {c['skipped']} skipped; summary: {Path(output) / 'summary.json'}")

        run(body, command="batch", json_out=json_out, quiet=quiet, render=render)
