"""report.html: the run report as one self-contained page (no scripts, no network, opens from disk).

Written beside every report.json. It shows what the JSON holds: the run's status and error, the
I/O contract, per-hop parity per output, per-pass node/size/time changes, the `auto` variants as
a latency-vs-accuracy plot (inline SVG), artifacts and warnings. A batch gets a dashboard
(OUT/report.html) of every model × target, linking each model's own page.
"""

from __future__ import annotations

import html
import math
import os
import secrets
from pathlib import Path

STYLE = """
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;margin:2rem auto;max-width:1100px;color:#1b1f24;padding:0 1rem}
h1{font-size:1.5rem;margin:.2rem 0}h2{font-size:1.1rem;margin-top:1.8rem;border-bottom:1px solid #d0d7de;padding-bottom:.2rem}
table{border-collapse:collapse;margin:.5rem 0;width:100%}th,td{border:1px solid #d0d7de;padding:.25rem .5rem;text-align:left;
vertical-align:top}th{background:#f6f8fa}td.num{text-align:right;font-variant-numeric:tabular-nums}
.ok{color:#1a7f37;font-weight:600}.bad{color:#cf222e;font-weight:600}.muted{color:#656d76}
.badge{display:inline-block;padding:.1rem .5rem;border-radius:1rem;color:#fff}.badge.ok{background:#1a7f37}.badge.bad{background:#cf222e}
code{background:#f6f8fa;padding:0 .2rem;border-radius:3px}svg text{font:11px sans-serif}
"""


def _e(v) -> str:
    return html.escape("" if v is None else str(v))


def _num(v, digits: int = 3) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        if math.isnan(v) or math.isinf(v):
            return str(v)
        return f"{v:.{digits}g}"
    return str(v)


def _size(n) -> str:
    if not isinstance(n, (int, float)):
        return "–"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _status(ok: bool, text: str | None = None) -> str:
    return f'<span class="{"ok" if ok else "bad"}">{_e(text or ("ok" if ok else "failed"))}</span>'


def _table(headers: list[str], rows: list[list[str]], numeric: set[int] = frozenset()) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f'<td class="num">{c}</td>' if i in numeric else f"<td>{c}</td>" for i, c in enumerate(r))
                   + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _page(title: str, body: str) -> str:
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
            f'<meta name="viewport" content="width=device-width,initial-scale=1"><style>{STYLE}</style></head>'
            f"<body>{body}</body></html>\n")


def _contract(report: dict) -> str:
    c = report.get("contract") or {}
    rows = []
    for kind in ("inputs", "outputs"):
        for t in c.get(kind) or []:
            rows.append([kind[:-1], f"<code>{_e(t.get('name'))}</code>", _e(t.get("dtype")),
                         _e(" × ".join(str(d) for d in t.get("shape") or [])), _e(t.get("layout") or "")])
    return "<h2>I/O contract</h2>" + _table(["", "name", "dtype", "shape", "layout"], rows) if rows else ""


def _parity(report: dict) -> str:
    out = []
    for hop in report.get("parity") or []:
        rows = [[f"<code>{_e(o.get('name'))}</code>", _num(o.get("max_abs")), _num(o.get("max_rel")),
                 _num(o.get("cosine"), 7), _status(bool(o.get("ok"))) + (f" {_e(o.get('reason'))}" if o.get("reason") else "")]
                for o in hop.get("outputs") or []]
        tol = hop.get("tolerance") or {}
        tol_text = ", ".join(f"{k}={_num(v)}" for k, v in tol.items() if not isinstance(v, dict))
        out.append(f"<h3>{_e(hop.get('hop'))} {_status(bool(hop.get('ok')))}</h3><p class=muted>tolerance: {_e(tol_text)}</p>"
                   + _table(["output", "max abs", "max rel", "cosine", "ok"], rows, {1, 2, 3}))
    return "<h2>Parity per hop</h2>" + "".join(out) if out else ""


def _passes(report: dict) -> str:
    rows = []
    for s in report.get("stages") or []:
        if "pass" not in s:
            continue
        nb, na, sb, sa = s.get("nodes_before"), s.get("nodes_after"), s.get("size_before"), s.get("size_after")
        dn = f"{na - nb:+d}" if isinstance(nb, int) and isinstance(na, int) else "–"
        ds = f"{(sa - sb) / sb:+.1%}" if isinstance(sb, int) and isinstance(sa, int) and sb else "–"
        rows.append([_e(s["pass"]), _status(s.get("status") not in ("rolled back", "failed"), s.get("status")),
                     f"{_e(nb)} → {_e(na)} ({dn})", f"{_size(sb)} → {_size(sa)} ({ds})", _num(s.get("seconds")), _e(s.get("reason") or "")])
    return "<h2>Optimisation passes</h2>" + _table(["pass", "status", "nodes", "size", "seconds", "reason"], rows, {4}) if rows else ""


def latency_accuracy_svg(variants: list[dict], width: int = 640, height: int = 320, *, x_label: str = "latency (ms)") -> str:
    """A scatter plot of the `auto` variants: latency (x) against parity error (y, log scale)."""
    pts = [v for v in variants if isinstance(v.get("latency_ms"), (int, float))]
    if not pts:
        return ""
    pad_l, pad_r, pad_t, pad_b = 64, 150, 16, 40
    xs = [float(v["latency_ms"]) for v in pts]
    errs = [max(float(v.get("max_abs") or 0.0), 1e-12) for v in pts]
    x0, x1 = 0.0, max(xs) * 1.1 or 1.0
    y0, y1 = math.log10(min(errs)) - 0.5, math.log10(max(errs)) + 0.5
    sx = lambda x: pad_l + (x - x0) / (x1 - x0) * (width - pad_l - pad_r)  # noqa: E731
    sy = lambda e: pad_t + (y1 - math.log10(e)) / (y1 - y0) * (height - pad_t - pad_b)  # noqa: E731
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" role="img" aria-label="latency versus accuracy" width="{width}" '
             f'height="{height}" viewBox="0 0 {width} {height}">',
             f'<rect x="{pad_l}" y="{pad_t}" width="{width - pad_l - pad_r}" height="{height - pad_t - pad_b}" fill="#fff" stroke="#d0d7de"/>',
             f'<text x="{(width - pad_r + pad_l) / 2}" y="{height - 8}" text-anchor="middle">{_e(x_label)}</text>',
             f'<text x="14" y="{(height - pad_b) / 2}" transform="rotate(-90 14 {(height - pad_b) / 2})" text-anchor="middle">'
             "max abs error (log)</text>"]
    for i in range(5):
        x = x0 + (x1 - x0) * i / 4
        parts.append(f'<text x="{sx(x):.1f}" y="{height - pad_b + 14}" text-anchor="middle">{_num(x)}</text>')
    for e in range(math.ceil(y0), math.floor(y1) + 1):
        parts.append(f'<text x="{pad_l - 4}" y="{sy(10.0 ** e) + 4:.1f}" text-anchor="end">1e{e}</text>')
    for v, x, err in zip(pts, xs, errs, strict=True):
        colour = "#1a7f37" if v.get("within_budget") else "#cf222e"
        r = 7 if v.get("chosen") else 4.5
        label = f"{v.get('runtime') + ' ' if v.get('runtime') else ''}{v.get('variant') or v.get('name') or v.get('precision')}"
        parts.append(f'<circle class="variant" cx="{sx(x):.1f}" cy="{sy(err):.1f}" r="{r}" fill="{colour}" '
                     f'stroke="{"#1b1f24" if v.get("chosen") else "none"}" stroke-width="2"><title>{_e(label)}: '
                     f'{_num(x)} ms, max abs {_num(err)}</title></circle>')
        parts.append(f'<text x="{sx(x) + 9:.1f}" y="{sy(err) + 4:.1f}">{_e(label)}{" (chosen)" if v.get("chosen") else ""}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _auto(report: dict) -> str:
    opt = report.get("optimize") or {}
    variants = opt.get("variants") or opt.get("candidates") or []
    if not variants:
        return ""
    runtimes = any(v.get("runtime") for v in variants)
    rows = [[*([_e(v.get("runtime"))] if runtimes else []), _e(v.get("variant") or v.get("name")), _e(v.get("precision")),
             _num(v.get("latency_ms")), _num(v.get("speedup")), _size(v.get("size")), _num(v.get("max_abs")), _num(v.get("cosine"), 7),
             _status(bool(v.get("within_budget")), "within" if v.get("within_budget") else "outside"),
             "<b>chosen</b>" if v.get("chosen") else ""] for v in variants]
    cols = [*(["runtime"] if runtimes else []), "variant", "precision", "latency ms", "speed-up", "size", "max abs", "cosine", "budget", ""]
    first = 3 if runtimes else 2
    return ("<h2>auto: latency against accuracy</h2>" + latency_accuracy_svg(variants)
            + _table(cols, rows, {first, first + 1, first + 3, first + 4}))


def _decoder_auto(report: dict) -> str:
    """The decoder variants `--optimize auto` timed (the `optimize:auto` stage of text generation)."""
    stage = next((s for s in report.get("stages") or [] if s.get("name") == "optimize:auto" and s.get("variants")), None)
    if stage is None:
        return ""
    variants = stage["variants"]
    rows = [[_e(v.get("variant")), _e(v.get("precision")), "yes" if v.get("fused") else "no", _num(v.get("prefill_ms")),
             _num(v.get("decode_tok_s"), 4), _num(v.get("decode_speedup")), _num(v.get("token_agreement"), 4), _num(v.get("max_abs")),
             _status(bool(v.get("within_budget")), "within" if v.get("within_budget") else "outside"),
             "<b>chosen</b>" if v.get("chosen") else _e(v.get("reason") or "")] for v in variants]
    cols = ["variant", "precision", "fused", "prefill ms", "decode tok/s", "speed-up", "token agreement", "max abs", "budget", ""]
    per_token = [{**v, "latency_ms": 1000.0 / v["decode_tok_s"]} for v in variants if v.get("decode_tok_s")]
    return (f"<h2>auto: decode speed against accuracy</h2><p class=muted>prompt {_e(stage.get('prompt_tokens'))} tokens, "
            f"{_e(stage.get('decode_steps'))} decode steps, median of {_e(stage.get('rounds'))} interleaved rounds; "
            f"ranked by decode tokens/s</p>" + latency_accuracy_svg(per_token, x_label="ms per decoded token")
            + _table(cols, rows, {3, 4, 5, 6, 7}))


def render_report(report: dict) -> str:
    ok = report.get("status") == "ok"
    src = report.get("source") or {}
    err = report.get("error") or {}
    head = (f"<h1>modelport {_e(report.get('command'))} <span class='badge {'ok' if ok else 'bad'}'>{_e(report.get('status'))}</span></h1>"
            f"<p class=muted>{_e(src.get('path') or '')} · {_e(src.get('framework') or '')} {_e(src.get('format') or '')} · "
            f"{_num(report.get('seconds'))} s · started {_e(report.get('started'))} · exit {_e(report.get('exit_code'))}</p>")
    if err:
        head += f"<p class=bad>error ({_e(err.get('type'))}, exit {_e(err.get('exit_code'))}): {_e(err.get('message'))}</p>"
    failures = report.get("target_failures") or []
    if failures:
        head += "<h2>Failed targets</h2>" + _table(["target", "exit", "error"], [[_e(f.get("target")), _e(f.get("exit_code")),
                                                                                _e(f.get("message"))] for f in failures])
    warnings = "".join(f"<li>{_e(w)}</li>" for w in report.get("warnings") or [])
    routed = any(a.get("route") for a in report.get("artifacts") or [])
    arts = [[_e(a.get("target")), _e(a.get("runtime")), _e(a.get("precision")), *([_e(a.get("route"))] if routed else []),
             _e(a.get("path")), _size(a.get("size")), _e(a.get("nodes", ""))] for a in report.get("artifacts") or []]
    art_cols = ["target", "runtime", "precision", *(["route"] if routed else []), "path", "size", "nodes"]
    stages = [[_e(s.get("name")), _num(s.get("seconds")), _size(s.get("peak_rss"))] for s in report.get("stages") or []
              if "pass" not in s]
    tools = ", ".join(f"{k} {v}" for k, v in (report.get("tool") or {}).items())
    body = (head + (f"<h2>Warnings</h2><ul>{warnings}</ul>" if warnings else "") + _contract(report)
            + ("<h2>Artifacts</h2>" + _table(art_cols, arts) if arts else "")
            + _parity(report) + _passes(report) + _auto(report) + _decoder_auto(report)
            + ("<h2>Stages</h2>" + _table(["stage", "seconds", "peak RSS"], stages, {1, 2}) if stages else "")
            + f"<p class=muted>{_e(tools)}</p>")
    return _page(f"modelport {report.get('command')} report", body)


def render_batch(summary: dict, out: Path) -> str:
    """The batch dashboard: every model × target, with links to each model's own report.html."""
    models = summary.get("models") or []
    targets = sorted({t for m in models for t in m.get("targets") or []})
    rows = []
    for m in models:
        name = m["name"]
        link = f'<a href="{_e(name)}/report.html">{_e(name)}</a>' if (out / name / "report.html").is_file() else _e(name)
        failed = {f.get("target") for f in m.get("target_failures") or []}
        made = {a.get("target") for a in m.get("artifacts") or []}
        cells = []
        for t in targets:
            if t not in (m.get("targets") or []):
                cells.append("")
            elif m.get("status") == "ok" or (t in made and t not in failed):
                cells.append(_status(True))
            else:
                cells.append(_status(False, m.get("status") if m.get("status") != "ok" else "failed"))
        note = "unchanged, skipped" if m.get("skipped") else _e(m.get("error") or "")
        kept = f' · <a href="{_e(m["kept"])}/">kept files</a>' if m.get("kept") else ""
        rows.append([link, _status(m.get("status") == "ok", m.get("status")), *cells, _num(m.get("seconds")), note + kept])
    c = summary.get("counts") or {}
    body = (f"<h1>modelport batch <span class='badge {'ok' if not c.get('failed') else 'bad'}'>"
            f"{_e(c.get('ok'))}/{_e(c.get('models'))} ok</span></h1>"
            f"<p class=muted>{_e(summary.get('manifest'))} · executor {_e(summary.get('executor'))} · {_num(summary.get('seconds'))} s "
            f"· {_e(c.get('skipped'))} skipped</p>"
            + _table(["model", "status", *targets, "seconds", "note"], rows, {2 + len(targets)}))
    return _page("modelport batch", body)


def write_html(path: Path, text: str) -> Path:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(6)}")  # batch pods sharing a volume are each pid 1
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path
