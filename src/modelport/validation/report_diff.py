"""`modelport report diff OLD NEW`: the regression gate between two reports or two batch summaries.

Compared per model and target: the run's status (a model that newly fails is a regression), each
artifact's size and node count, each parity hop's worst errors (max abs, max rel) and lowest
cosine, and latencies where a report has them (`latency_ms` of artifacts and of the `auto` variants).
Each metric is judged against a threshold (`DiffThresholds`); a breach is a regression and the
command exits 4.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from modelport.errors import BadInputError, one_line

REPORT_SCHEMA = "modelport.report/1"
BATCH_SCHEMA = "modelport.batch/1"
DIFF_SCHEMA = "modelport.report-diff/1"


@dataclass(frozen=True)
class DiffThresholds:
    size_growth: float = 0.10  # fraction: 0.10 means an artifact may grow by 10 %
    nodes_growth: float = 0.10
    error_growth: float = 10.0  # factor on max_abs / max_rel (and at least `error_floor` above the old value)
    error_floor: float = 1e-6
    cosine_drop: float = 1e-4
    latency_growth: float = 0.20

    def __post_init__(self):
        for name in ("size_growth", "nodes_growth", "error_growth", "error_floor", "cosine_drop", "latency_growth"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or v < 0:
                raise BadInputError(f"bad threshold {name}={v!r}: a number >= 0")


def load(path: str | Path) -> dict:
    path = Path(path)
    if path.is_dir():
        for name in ("summary.json", "report.json"):
            if (path / name).is_file():
                path = path / name
                break
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise BadInputError("no such report", path=path) from None
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise BadInputError(f"not a JSON report: {one_line(e)}", path=path) from None
    if not isinstance(doc, dict) or doc.get("schema") not in (REPORT_SCHEMA, BATCH_SCHEMA):
        raise BadInputError(f"not a modelport report or batch summary (schema {REPORT_SCHEMA} or {BATCH_SCHEMA})", path=path)
    doc["_path"] = str(path)
    return doc


def _models(doc: dict) -> dict[str, dict]:
    """{model name: {status, error, artifacts, parity, latencies}} of a report or a summary."""
    if doc["schema"] == BATCH_SCHEMA:
        base = Path(doc["_path"]).parent
        out = {}
        for m in doc.get("models") or []:
            entry = dict(m)
            rp = base / m["name"] / "report.json"
            if m.get("status") == "ok" and rp.is_file():
                rep = json.loads(rp.read_text())
                entry.update(artifacts=rep.get("artifacts") or [], parity=rep.get("parity") or [], optimize=rep.get("optimize"))
            out[m["name"]] = entry
        return out
    name = Path(str((doc.get("source") or {}).get("path") or "model")).name
    return {name: {"status": doc.get("status"), "error": (doc.get("error") or {}).get("message"),
                   "artifacts": doc.get("artifacts") or [], "parity": doc.get("parity") or [], "optimize": doc.get("optimize")}}


def _latencies(entry: dict) -> dict[str, float]:
    out = {}
    for a in entry.get("artifacts") or []:
        if isinstance(a.get("latency_ms"), (int, float)):
            out[f"{a.get('target')}"] = float(a["latency_ms"])
    opt = entry.get("optimize") or {}
    variants = (opt.get("variants") or opt.get("candidates") or []) if isinstance(opt, dict) else []
    for c in variants:
        if isinstance(c, dict) and isinstance(c.get("latency_ms"), (int, float)):
            name = c.get("variant") or c.get("name") or c.get("precision")
            out[f"auto:{c['runtime'] + '/' if c.get('runtime') else ''}{name}"] = float(c["latency_ms"])
    return out


def _row(model, target, metric, old, new, regression, note=""):
    change = None
    if isinstance(old, (int, float)) and isinstance(new, (int, float)) and old:
        change = (new - old) / abs(old)
    return {"model": model, "target": target, "metric": metric, "old": old, "new": new, "change": change,
            "regression": bool(regression), "note": note}


def diff(old: dict, new: dict, thresholds: DiffThresholds | None = None) -> dict:
    """The comparison document: every compared metric as a row, and the regressions among them."""
    t = thresholds or DiffThresholds()
    a, b = _models(old), _models(new)
    rows = []
    for name in sorted(set(a) | set(b)):
        o, n = a.get(name), b.get(name)
        if o is None:
            rows.append(_row(name, "", "status", None, n.get("status"), n.get("status") != "ok", "new model"))
            continue
        if n is None:
            rows.append(_row(name, "", "status", o.get("status"), None, False, "model removed"))
            continue
        if o.get("status") != n.get("status"):
            newly_failing = o.get("status") == "ok" and n.get("status") != "ok"
            rows.append(_row(name, "", "status", o.get("status"), n.get("status"), newly_failing,
                             (n.get("error") or "") if newly_failing else ""))
        arts_o = {x.get("target"): x for x in o.get("artifacts") or []}
        arts_n = {x.get("target"): x for x in n.get("artifacts") or []}
        for target in sorted(set(arts_o) & set(arts_n), key=str):
            for metric, limit in (("size", t.size_growth), ("nodes", t.nodes_growth)):
                vo, vn = arts_o[target].get(metric), arts_n[target].get(metric)
                if isinstance(vo, (int, float)) and isinstance(vn, (int, float)):
                    rows.append(_row(name, target, metric, vo, vn, vn > vo * (1 + limit)))
        for target in sorted(set(arts_o) - set(arts_n), key=str):
            if n.get("status") == "ok":
                rows.append(_row(name, target, "artifact", "present", None, True, "target no longer produced"))
        hops_o = {h.get("hop"): h for h in o.get("parity") or []}
        for hop in n.get("parity") or []:
            ho = hops_o.get(hop.get("hop"))
            if not ho:
                continue
            outs_o = {x.get("name"): x for x in ho.get("outputs") or []}
            for out in hop.get("outputs") or []:
                xo = outs_o.get(out.get("name"))
                if not xo:
                    continue
                label = f"{hop.get('hop')}:{out.get('name')}"
                for metric in ("max_abs", "max_rel"):
                    vo, vn = xo.get(metric), out.get(metric)
                    if isinstance(vo, (int, float)) and isinstance(vn, (int, float)):
                        rows.append(_row(name, label, metric, vo, vn, vn > max(vo * t.error_growth, vo + t.error_floor)))
                vo, vn = xo.get("cosine"), out.get("cosine")
                if isinstance(vo, (int, float)) and isinstance(vn, (int, float)):
                    rows.append(_row(name, label, "cosine", vo, vn, vn < vo - t.cosine_drop))
        lat_o, lat_n = _latencies(o), _latencies(n)
        for key in sorted(set(lat_o) & set(lat_n)):
            rows.append(_row(name, key, "latency_ms", lat_o[key], lat_n[key], lat_n[key] > lat_o[key] * (1 + t.latency_growth)))
    regressions = [r for r in rows if r["regression"]]
    return {"schema": DIFF_SCHEMA, "old": old["_path"], "new": new["_path"], "thresholds": t.__dict__,
            "regressions": len(regressions), "rows": rows}
