"""Rich tables for reports: stages, artifacts and parity, the same data as report.json."""

from __future__ import annotations

from rich.table import Table

from modelport.cli._common import console, fmt_num, fmt_size


def parity_table(report: dict) -> Table:
    t = Table(title="parity", title_justify="left")
    for col in ("hop", "output", "max abs", "max rel", "cosine", "ok"):
        t.add_column(col)
    for hop in report.get("parity", []):
        for o in hop["outputs"]:
            t.add_row(hop["hop"], o["name"], fmt_num(o["max_abs"]), fmt_num(o["max_rel"]),
                      f"{o['cosine']:.6f}" if o.get("cosine") is not None else "-",
                      "[green]yes[/]" if o["ok"] else f"[red]no[/] {o.get('reason', '')}")
    return t


def stages_table(report: dict, *, passes: bool = True) -> Table:
    """Every stage; without `passes`, the optimisation passes are left to their own table."""
    t = Table(title="stages", title_justify="left")
    t.add_column("stage")
    t.add_column("seconds", justify="right")
    t.add_column("details")
    for s in report.get("stages", []):
        if not passes and "pass" in s:
            continue
        details = ", ".join(f"{k}={v}" for k, v in s.items() if k not in ("name", "seconds") and v is not None and not isinstance(v, (dict, list)))
        t.add_row(s["name"], f"{s.get('seconds', 0):.2f}", details)
    return t


def artifacts_table(report: dict) -> Table:
    t = Table(title="artifacts", title_justify="left")
    for col in ("target", "route", "runtime", "precision", "path", "size"):
        t.add_column(col)
    for a in report.get("artifacts", []):
        precision = a.get("precision", "")
        if a.get("requested_precision") and a["requested_precision"] != precision:
            precision = f"[yellow]{precision}[/] ({a['requested_precision']} requested)"
        if a.get("inference_precision"):  # what the runtime ran it at, read back (OpenVINO)
            plain = (a.get("plain_compile") or {}).get("inference_precision")
            differs = plain and plain != a["inference_precision"]
            precision += f" (runs {a['inference_precision']}" + (f"; [yellow]{plain} by default[/]" if differs else "") + ")"
        t.add_row(a["target"], a.get("route", "onnx"), a["runtime"], precision, a["path"], fmt_size(a.get("size", 0)))
    return t


def render_report(report: dict, out_dir: str | None = None, *, passes_shown: bool = False) -> None:
    console.print(stages_table(report, passes=not passes_shown))
    if report.get("artifacts"):
        console.print(artifacts_table(report))
    if report.get("parity"):
        console.print(parity_table(report))
    if out_dir:
        console.print(f"[green]wrote[/] {out_dir} (report.json)")
