"""What CI systems read: JUnit XML, GitHub Actions annotations and a Markdown step summary.

JUnit: one test suite per model, one test case per target × parity hop (a failed hop carries its
figures: per output max abs/rel error and cosine against the tolerance); a run that failed before
any parity is one test case, `convert`, with the error. GitHub: with `GITHUB_ACTIONS=true` each
failure is an `::error` workflow command and a Markdown table is appended to
`$GITHUB_STEP_SUMMARY`.
"""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from pathlib import Path

from modelport.errors import one_line


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)


def parity_figures(hop: dict) -> str:
    """One line per output: its error figures and the tolerance they were judged by."""
    lines = []
    for out in hop.get("outputs") or []:
        figs = ", ".join(f"{k}={_fmt(out[k])}" for k in ("max_abs", "max_rel", "cosine", "mismatch") if out.get(k) is not None)
        reason = f" ({out['reason']})" if out.get("reason") else ""
        lines.append(f"{out.get('name')}: {'ok' if out.get('ok', True) else 'FAILED'} {figs}{reason}")
    tol = hop.get("tolerance") or {}
    if tol:
        lines.append("tolerance: " + ", ".join(f"{k}={_fmt(v)}" for k, v in tol.items() if not isinstance(v, dict)))
    return "\n".join(lines)


def _hop_target(hop: str) -> str:
    # hops are named "pytorch→onnx (IR)", "onnx→tflite", ...: the target is the word after the arrow
    tail = hop.replace("->", "→").split("→")[-1].split()
    return tail[0] if tail else hop


def _suite(name: str, report: dict | None, *, status: str, error: str | None, seconds: float | None) -> ET.Element:
    suite = ET.Element("testsuite", name=name)
    cases = []
    for hop in (report or {}).get("parity") or []:
        case = ET.Element("testcase", classname=f"{name}.{_hop_target(hop.get('hop', ''))}", name=hop.get("hop", "parity"))
        if not hop.get("ok", False):
            fail = ET.SubElement(case, "failure", message=f"parity failed at {hop.get('hop')}", type="parity")
            fail.text = parity_figures(hop)
        else:
            ET.SubElement(case, "system-out").text = parity_figures(hop)
        cases.append(case)
    if status != "ok" or not cases:
        case = ET.Element("testcase", classname=name, name=(report or {}).get("command") or "convert")
        if seconds is not None:
            case.set("time", f"{seconds:.3f}")
        if status != "ok":
            kind = "error" if status in ("crashed", "timeout", "out-of-memory") else "failure"
            ET.SubElement(case, kind, message=one_line(error or status, 500), type=status).text = error or status
        cases.append(case)
    suite.extend(cases)
    suite.set("tests", str(len(cases)))
    suite.set("failures", str(sum(c.find("failure") is not None for c in cases)))
    suite.set("errors", str(sum(c.find("error") is not None for c in cases)))
    if seconds is not None:
        suite.set("time", f"{seconds:.3f}")
    return suite


def _write(root: ET.Element, path: str | Path) -> Path:
    path = Path(path)
    ET.indent(root)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    ET.ElementTree(root).write(tmp, encoding="utf-8", xml_declaration=True)
    os.replace(tmp, path)
    return path


def junit_for_report(report: dict, path: str | Path, name: str | None = None) -> Path:
    """JUnit XML of one command's report."""
    source = (report.get("source") or {}).get("path") or report.get("command") or "model"
    name = name or Path(str(source)).name
    err = report.get("error") or {}
    suite = _suite(name, report, status=report.get("status", "failed"), error=err.get("message"), seconds=report.get("seconds"))
    root = ET.Element("testsuites", name="modelport")
    root.append(suite)
    _summarise(root)
    return _write(root, path)


def junit_for_batch(summary: dict, out: Path, path: str | Path) -> Path:
    """JUnit XML of a batch: one suite per model, its report read from OUT/<name>/report.json when it has one."""
    import json

    root = ET.Element("testsuites", name="modelport batch")
    for m in summary.get("models") or []:
        report = None
        rp = out / m["name"] / "report.json"
        if m.get("status") == "ok" and rp.is_file():
            report = json.loads(rp.read_text())
        elif m.get("parity"):
            report = {"parity": m["parity"]}
        if m.get("status") == "not-run":
            continue
        root.append(_suite(m["name"], report, status=m.get("status", "failed"), error=m.get("error"), seconds=m.get("seconds")))
    _summarise(root)
    return _write(root, path)


def _summarise(root: ET.Element) -> None:
    for attr in ("tests", "failures", "errors"):
        root.set(attr, str(sum(int(s.get(attr, 0)) for s in root)))


# --- GitHub Actions ------------------------------------------------------------------------------

def on_github() -> bool:
    return os.environ.get("GITHUB_ACTIONS") == "true"


def _escape(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def annotations(rows: list[dict]) -> list[str]:
    """`::error` workflow commands, one per failed row ({name, status, error, file?})."""
    out = []
    for r in rows:
        if r.get("status") in ("ok", "not-run"):
            continue
        where = f" file={r['file']}," if r.get("file") else " "
        out.append(f"::error{where}title=modelport {r['name']}::{_escape(str(r.get('error') or r.get('status')))}")
    return out


def step_summary_markdown(rows: list[dict], title: str) -> str:
    lines = [f"### {title}", "", "| model | status | seconds | targets | error |", "| --- | --- | ---: | --- | --- |"]
    for r in rows:
        err = one_line(str(r.get("error") or "").replace("|", "\\|"))
        lines.append(f"| {r['name']} | {'✅' if r.get('status') == 'ok' else '❌'} {r.get('status')} | "
                     f"{_fmt(r.get('seconds') or 0.0)} | {', '.join(r.get('targets') or [])} | {err} |")
    return "\n".join(lines) + "\n"


def publish_to_github(rows: list[dict], title: str, write_line) -> None:
    """When running under GitHub Actions: annotations through `write_line`, and the step summary."""
    if not on_github():
        return
    for line in annotations(rows):
        write_line(line)
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        with open(summary, "a", encoding="utf-8") as f:
            f.write(step_summary_markdown(rows, title))


def report_row(report: dict) -> dict:
    """A single command's report as one row of the GitHub outputs."""
    src = (report.get("source") or {}).get("path")
    err = report.get("error") or {}
    return {"name": Path(str(src)).name if src else report.get("command", "model"), "status": report.get("status"),
            "error": err.get("message"), "seconds": report.get("seconds"), "file": src,
            "targets": [a.get("target") for a in report.get("artifacts") or []]}
