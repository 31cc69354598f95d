"""Encoder conversion at scale: peak memory (whole process tree) and wall time of `modelport convert
--task feature-extraction` on the general route (the dynamo export), against the export a user
writes by hand (`torch.onnx.export(..., dynamo=True)` of the transformers model, weights to an
external data file), on one random-init BERT-shaped folder built from a config (default: 16 layers,
hidden 1024, 234 M parameters, 0.94 GB in fp32).

Rows, run in turn within each round (a burst of load on a shared machine hits every row alike):

    torch.onnx.export   the peer: load the folder, export, save (no validation, no checks)
    modelport onnx      modelport convert FOLDER --task feature-extraction -o OUT
    modelport all       ... --optimize all (parity-gated passes, transformer fusions)
    modelport ort       ... --to ort (the ORT format, written by onnxruntime)
    modelport int8      ... --precision int8 (onnxruntime's dynamic quantiser)

Each command runs in its own process; a sampler reads the RSS of that process and its children
every 0.2 s and keeps the largest sum (bench/llm_scale.py's). modelport's rows also print the
report's own figure (`peak_rss`: the same sum every 0.1 s, and the kernel's high-water marks, which
catch what a sampler misses inside one C call) and each stage's peak. Figures are ratios against
the fp32 weights and against the peer's peak in the same round.

Usage: python bench/encoder_scale.py [--layers 16 --hidden 1024 --heads 16 --intermediate 4096
                                      --rounds 1 --rows onnx,all,ort,int8 --work DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llm_scale import measured, split_wall, stage_lines  # noqa: E402

ROWS = {
    "onnx": [],
    "all": ["--optimize", "all"],
    "ort": ["--to", "ort"],
    "int8": ["--precision", "int8"],
}

PEER = """
import sys, torch
from transformers import AutoModel
model = AutoModel.from_pretrained(sys.argv[1]).eval()
ids = torch.ones((1, 16), dtype=torch.long)
torch.onnx.export(model, (ids,), sys.argv[2], dynamo=True, external_data=True,
                  input_names=["input_ids"], dynamic_shapes=({0: torch.export.Dim("batch"), 1: torch.export.Dim("sequence")},))
"""


def build(folder: Path, a) -> int:
    """A random-init BERT folder (fp32 safetensors); returns its weights' bytes."""
    if not (folder / "config.json").exists():
        import torch
        from transformers import BertConfig, BertModel

        torch.manual_seed(0)
        cfg = BertConfig(hidden_size=a.hidden, num_hidden_layers=a.layers, num_attention_heads=a.heads,
                         intermediate_size=a.intermediate)
        BertModel(cfg).save_pretrained(folder)
    return sum(p.stat().st_size for p in folder.glob("*.safetensors"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--intermediate", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--work", type=Path)
    a = ap.parse_args(argv)
    rows = [r.strip() for r in a.rows.split(",") if r.strip()]
    unknown = [r for r in rows if r not in ROWS]
    if unknown:
        ap.error(f"unknown rows {unknown}; known: {', '.join(ROWS)}")
    work = a.work or Path(tempfile.mkdtemp(prefix="modelport-encoder-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    folder = work / "encoder"
    weights = build(folder, a)
    print(f"folder {folder}: {weights / 1e9:.2f} GB of fp32 weights", flush=True)
    env = dict(os.environ)
    results: dict[str, list[tuple[int, float, int, int | None, float | None, float | None]]] = {}
    for round_ in range(a.rounds):
        out = work / f"peer{round_}"
        out.mkdir(exist_ok=True)
        rc, wall, peak = measured([sys.executable, "-c", PEER, str(folder), str(out / "model.onnx")], work / "peer.log", env)
        print(f"torch.onnx.export: exit {rc}, {wall:.1f} s, peak {peak / 1e9:.2f} GB", flush=True)
        results.setdefault("torch.onnx.export", []).append((rc, wall, peak, None, None, None))
        for row in rows:
            out = work / f"{row}{round_}"
            cmd = [sys.executable, "-m", "modelport", "convert", str(folder), "--task", "feature-extraction",
                   *ROWS[row], "-o", str(out), "--force", "-q"]
            rc, wall, peak = measured(cmd, work / f"{row}.log", env)
            try:
                reported = json.loads((out / "report.json").read_text()).get("peak_rss")
            except (OSError, ValueError):
                reported = None
            convert_s, check_s = split_wall(out / "report.json")
            print(f"modelport {row}: exit {rc}, {wall:.1f} s, peak {peak / 1e9:.2f} GB (report {(reported or 0) / 1e9:.2f} GB)",
                  *stage_lines(out / "report.json"), sep="\n", flush=True)
            results.setdefault(f"modelport {row}", []).append((rc, wall, peak, reported, convert_s, check_s))
    print(f"\n{folder.name}: {weights / 1e9:.2f} GB of weights; medians over {a.rounds} round(s); peak RSS of the process tree")
    print("| row | exit | wall s | convert s | validate s | peak GB (sampled) | peak GB (report) | x weights | vs torch.onnx.export |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")

    def median(values):
        values = sorted(v for v in values if v is not None)
        return values[len(values) // 2] if values else None

    peer = median([r[2] for r in results["torch.onnx.export"]])
    for name, runs in results.items():
        rc = max(r[0] for r in runs)
        wall, peak, reported = median([r[1] for r in runs]), median([r[2] for r in runs]), median([r[3] for r in runs])
        convert_s, check_s = median([r[4] for r in runs]), median([r[5] for r in runs])
        top = max(peak, reported or 0)
        print(f"| {name} | {rc} | {wall:.1f} | {'' if convert_s is None else f'{convert_s:.1f}'} | "
              f"{'' if check_s is None else f'{check_s:.1f}'} | {peak / 1e9:.2f} | {'' if reported is None else f'{reported / 1e9:.2f}'} | "
              f"{top / weights:.1f} | {'' if name == 'torch.onnx.export' else f'{top / peer:.2f}x'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
