"""ONNX backend node suite → PyTorch code: modelport's pass rate per op, beside onnx2torch's.

    .venv/bin/python bench/pytorch_code_conformance.py [--peer bench/.peer-venv] [--json out.json]

Every node case shipped with the installed `onnx` package is built once here and written to a
temporary folder (model.onnx + inputs/outputs .npz); modelport generates, runs and compares code
for each, and when the peer's virtual environment exists, `onnx2torch` converts and runs the very
same files in that environment (its torch/torchvision never touch the project's). Create it with:

    python -m venv bench/.peer-venv && bench/.peer-venv/bin/pip install onnx2torch torch torchvision onnxruntime
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

PEER_SCRIPT = r'''
import json, sys, warnings
from pathlib import Path
import numpy as np
import onnx, torch
from onnx2torch import convert
warnings.simplefilter("ignore")
root = Path(sys.argv[1])
results = {}
for case in sorted(p for p in root.iterdir() if p.is_dir()):
    meta = json.loads((case / "meta.json").read_text())
    try:
        model = convert(onnx.load(str(case / "model.onnx")))
        with np.load(case / "io.npz") as z:
            ins = [torch.from_numpy(z[f"in{i}"]) for i in range(meta["n_in"])]
            want = [z[f"out{i}"] for i in range(meta["n_out"])]
        with torch.no_grad():
            out = model(*ins)
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        ok = len(outs) == len(want)
        for g, w in zip(outs, want):
            g = g.detach().numpy() if hasattr(g, "detach") else np.asarray(g)
            if g.shape != w.shape:
                ok = False
            elif w.dtype.kind in "fc":
                ok = ok and np.allclose(g.astype(np.float64), w.astype(np.float64), rtol=meta["rtol"], atol=meta["atol"], equal_nan=True)
            else:
                ok = ok and np.array_equal(g, w)
        results[case.name] = bool(ok)
    except Exception:
        results[case.name] = False
print(json.dumps(results))
'''


def dump_cases(cases, folder: Path) -> set[str]:
    """Write the cases the peer can read (plain numpy inputs/outputs); returns their names."""
    written = set()
    for c in cases:
        arrays = c.inputs + c.outputs
        if not all(isinstance(a, np.ndarray) and a.dtype.kind in "biufc" and a.dtype.name != "bfloat16" for a in arrays):
            continue
        d = folder / c.name
        d.mkdir()
        (d / "model.onnx").write_bytes(c.model.SerializeToString())
        np.savez(d / "io.npz", **{f"in{i}": a for i, a in enumerate(c.inputs)}, **{f"out{i}": a for i, a in enumerate(c.outputs)})
        (d / "meta.json").write_text(json.dumps({"n_in": len(c.inputs), "n_out": len(c.outputs), "rtol": c.rtol, "atol": c.atol}))
        written.add(c.name)
    return written


def run_peer(python: Path, folder: Path) -> dict[str, bool]:
    p = subprocess.run([str(python), "-c", PEER_SCRIPT, str(folder)], capture_output=True, text=True, timeout=3600)
    if p.returncode != 0:
        raise SystemExit(f"the peer run failed: {p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peer", default=str(ROOT / "bench" / ".peer-venv"), help="onnx2torch's virtual environment")
    ap.add_argument("--json", help="write per-case results here")
    ap.add_argument("--markdown", action="store_true", help="print the per-op table as Markdown")
    args = ap.parse_args()

    from modelport.emitters.pytorch_code.conformance import collect_cases, run_case

    t0 = time.perf_counter()
    cases = collect_cases()
    ours = {c.name: run_case(c) for c in cases}
    t_ours = time.perf_counter() - t0
    peer_python = Path(args.peer) / "bin" / "python"
    peer: dict[str, bool] | None = None
    if peer_python.exists():
        with tempfile.TemporaryDirectory(prefix="modelport-node-cases-") as tmp:
            dump_cases(cases, Path(tmp))
            t1 = time.perf_counter()
            peer = run_peer(peer_python, Path(tmp))
            t_peer = time.perf_counter() - t1
    by_op: dict[str, list[int]] = {}
    for c in cases:
        row = by_op.setdefault(c.op, [0, 0, 0])
        row[0] += int(ours[c.name].ok)
        row[1] += int(bool(peer and peer.get(c.name)))
        row[2] += 1
    head = ["op", "cases", "modelport", "onnx2torch"] if peer is not None else ["op", "cases", "modelport"]
    if args.markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
    else:
        print(f"{'op':32} {'cases':>5} {'modelport':>10}" + (f" {'onnx2torch':>10}" if peer is not None else ""))
    for op, (mine, theirs, total) in sorted(by_op.items()):
        cells = [op, str(total), f"{mine}/{total}"] + ([f"{theirs}/{total}"] if peer is not None else [])
        if args.markdown:
            print("| " + " | ".join(cells) + " |")
        else:
            print(f"{op:32} {total:>5} {cells[2]:>10}" + (f" {cells[3]:>10}" if peer is not None else ""))
    n = len(cases)
    mine = sum(o.ok for o in ours.values())
    line = f"\nall {n} node cases: modelport {mine}/{n} ({100 * mine / n:.1f}%, {t_ours:.0f} s)"
    if peer is not None:
        theirs = sum(1 for c in cases if peer.get(c.name))
        line += f"; onnx2torch {theirs}/{n} ({100 * theirs / n:.1f}%, {t_peer:.0f} s)"
        worse = [op for op, (m, t, _) in by_op.items() if t > m]
        line += f"\nops where onnx2torch passes more cases: {', '.join(sorted(worse)) or 'none'}"
    else:
        line += f"\n(onnx2torch not compared: no {peer_python})"
    print(line)
    if args.json:
        Path(args.json).write_text(json.dumps({c.name: {"op": c.op, "modelport": ours[c.name].ok, "stage": ours[c.name].stage,
                                                        "detail": ours[c.name].detail,
                                                        "onnx2torch": None if peer is None else peer.get(c.name)} for c in cases}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
