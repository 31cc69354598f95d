"""Optimisation benchmark: node count, file size, onnxruntime CPU latency and parity, side by side.

Models (built locally, random init): a ResNet-18-sized CNN at 1x3x224x224 (its convolutions He-initialised
as torchvision's ResNet is; with PyTorch's default init its outputs differed by 4e-8 between two
inputs on a scale of 0.04, so no accuracy figure on it meant anything), a BERT-like encoder
(4 layers, hidden 256, 4 heads) and a GPT-like decoder (4 layers, hidden 256), both at sequence
128. Variants: the raw torch.onnx export, onnxsim alone, onnxruntime's own offline optimisation
(ORT_ENABLE_EXTENDED, saved), modelport's levels, FP16 and INT8 dynamic; and, when OpenVINO is
installed, OpenVINO on the raw export with the inference precision pinned to f32, in bf16 (where
the CPU has it), INT8 static (NNCF, calibrated on 8 samples drawn like the references) and INT8
weights. OpenVINO and onnxruntime rows of one model are timed in the same interleaved rounds. The
CPU's flags and OpenVINO's OPTIMIZATION_CAPABILITIES are printed first.

`auto` runs as `convert --optimize auto` does (budget cosine >= 0.999), at the bench's `--threads`:
on onnxruntime alone, and (with OpenVINO) across both runtimes with those 8 samples as
`--calibration`. Every candidate of each run that is within budget joins the bench's rounds as a
row `auto, ...: VARIANT` (the chosen one marked), and a last table puts the chosen candidate beside
the fastest within budget in those rounds: `chosen / fastest` is 1.00 when auto kept the fastest.

Latencies are measured interleaved: every variant of a model gets one run per round, for `--runs`
rounds after a warm-up, and the median is reported, so that a noisy machine slows every variant
alike instead of whichever happened to run during the noise. onnxruntime sessions run with
spinning off (a spinning session's threads would load the cores while the next one runs).
`--threads 1` gives the steadiest ratios on a small shared machine; the default (0) is
onnxruntime's own thread count.

Each transformer model also gets a **GEMM floor** row: the same onnxruntime timing of only the model's
weight GEMMs (every MatMul/Gemm with a constant 2-D weight, at the shapes the raw export runs
them), as independent nodes. No graph rewrite can make an FP32 model faster than its GEMMs, so
`raw / floor` is the ceiling of any FP32 speed-up from fusion on that runtime and machine.

    .venv/bin/python bench/optimize_bench.py [--runs 20] [--threads 0] [--models cnn,bert,gpt]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path


def build(name: str):
    import torch

    torch.manual_seed(0)
    if name == "cnn":
        from torch import nn

        def block(cin, cout, stride):
            return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
                                 nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())

        layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
        cin = 64
        for cout, stride in ((64, 1), (64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2), (512, 1)):
            layers.append(block(cin, cout, stride))
            cin = cout
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 1000)]
        for layer in layers:  # torchvision's ResNet init: PyTorch's default fades the signal through 17 plain convs
            for conv in (m for m in layer.modules() if isinstance(m, nn.Conv2d)):
                nn.init.kaiming_normal_(conv.weight, mode="fan_out", nonlinearity="relu")
        return nn.Sequential(*layers).eval(), (torch.randn(1, 3, 224, 224),), ["input"]
    from transformers import BertConfig, BertModel, GPT2Config, GPT2Model

    ids = torch.randint(0, 1000, (1, 128))
    if name == "bert":
        m = BertModel(BertConfig(vocab_size=1000, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                                 intermediate_size=1024, attn_implementation="eager")).eval()
        return m, (ids, torch.ones_like(ids)), ["input_ids", "attention_mask"]
    m = GPT2Model(GPT2Config(vocab_size=1000, n_embd=256, n_layer=4, n_head=4, n_positions=256, use_cache=False,
                             attn_implementation="eager")).eval()
    return m, (ids,), ["input_ids"]


def export(name: str, folder: Path) -> Path:
    import contextlib
    import io

    import torch

    model, args, names = build(name)
    path = folder / f"{name}.onnx"
    with contextlib.redirect_stdout(io.StringIO()):
        torch.onnx.export(model, args, str(path), input_names=names, dynamo=True, external_data=False)
    return path


def ort_offline(src: Path, dst: Path) -> Path:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.optimized_model_filepath = str(dst)
    ort.InferenceSession(str(src), so, providers=["CPUExecutionProvider"])
    return dst


def gemm_floor(model, feeds):
    """A model of only `model`'s weight GEMMs at their run-time shapes, and feeds for it."""
    import numpy as np
    from onnx import helper, numpy_helper

    from modelport.runtimes.onnxruntime import run_tensors

    weights = {i.name: i for i in model.graph.initializer}
    gemms = [n for n in model.graph.node if n.op_type in ("MatMul", "Gemm") and len(n.input) > 1
             and n.input[1] in weights and len(weights[n.input[1]].dims) == 2]
    acts = {}
    for values in run_tensors(model, feeds, sorted({n.input[0] for n in gemms})):
        acts.update(values)
    nodes, inits, inputs, outputs, floor_feeds = [], [], [], [], {}
    rng = np.random.default_rng(0)
    for i, n in enumerate(gemms):
        x = acts[n.input[0]]
        w = weights[n.input[1]]
        trans_b = next((a.i for a in n.attribute if a.name == "transB"), 0) if n.op_type == "Gemm" else 0
        k = w.dims[1] if trans_b else w.dims[0]
        rows = int(np.prod(x.shape)) // k
        inputs.append(helper.make_tensor_value_info(f"x{i}", 1, [rows, k]))
        outputs.append(helper.make_tensor_value_info(f"y{i}", 1, None))
        floor_feeds[f"x{i}"] = rng.standard_normal((rows, k)).astype(np.float32)
        inits.append(numpy_helper.from_array(numpy_helper.to_array(w).astype(np.float32), f"w{i}"))
        nodes.append(helper.make_node("Gemm", [f"x{i}", f"w{i}"], [f"y{i}"], transB=trans_b))
    graph = helper.make_graph(nodes, "gemm_floor", inputs, outputs, inits)
    floor = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    floor.ir_version = 8
    return floor, floor_feeds, len(gemms)


def interleaved_ms(runners: dict, feeds: dict, *, runs: int, warmup: int = 5) -> dict[str, float]:
    """Median latency (ms) of each runner (onnxruntime or OpenVINO), one run per runner per round."""
    import statistics
    import time

    for k, r in runners.items():
        for _ in range(warmup):
            r.run(feeds[k])
    times: dict[str, list[float]] = {k: [] for k in runners}
    for _ in range(runs):
        for k, r in runners.items():
            t = time.perf_counter()
            r.run(feeds[k])
            times[k].append((time.perf_counter() - t) * 1000)
    return {k: statistics.median(v) for k, v in times.items()}


def cpu_features() -> str:
    """The CPU model, its SIMD flags that matter here, and OpenVINO's view of them."""
    import platform

    flags, model = set(), platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
    except OSError:
        pass
    wanted = ["avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_int8", "amx_fp16"]
    text = f"CPU: {model}; flags: {', '.join(f for f in wanted if f in flags) or 'none of ' + ', '.join(wanted)}"
    try:
        from modelport.runtimes.openvino import cpu_capabilities

        text += f"; OpenVINO OPTIMIZATION_CAPABILITIES: {', '.join(cpu_capabilities())}"
    except Exception as e:  # OpenVINO not installed
        text += f"; OpenVINO: {type(e).__name__}"
    return text


def calibration_npz(ir, path: Path, samples: int = 8) -> Path:
    """`samples` input sets drawn like the references (other seeds), stacked, as an .npz."""
    import numpy as np

    from modelport.reference.samples import make_inputs

    sets = [make_inputs(ir.inputs, {}, seed=100 + i) for i in range(samples)]
    np.savez(path, **{s.name: np.stack([x[s.name] for x in sets]) for s in ir.inputs})
    return path


def openvino_variants(ir, calib: Path, threads: int) -> dict:
    """label -> (runner, precision, nodes, size): OpenVINO on the raw export at each precision this CPU runs."""
    from modelport.errors import ValidationError
    from modelport.optimize import openvino_precision as ovp
    from modelport.optimize.calibration import load_calibration
    from modelport.runtimes import openvino as ovr

    plans = [("openvino fp32 (f32 pinned)", "fp32", None)]
    if ovr.supports("bf16"):
        plans.append(("openvino bf16", "bf16", None))
    plans += [("openvino int8 static (NNCF)", "int8", "static"), ("openvino int8 weights (NNCF)", "int8", "weights")]
    data = load_calibration(calib, ir)
    out = {}
    for label, precision, mode in plans:
        try:
            model, details = ovp.build(ir, precision, calibration=data if mode == "static" else None, int8_mode=mode)
        except ValidationError as e:
            print(f"| | {label} | | | | not delivered | {e.reason[:80]} | |", flush=True)
            continue
        with tempfile.TemporaryDirectory() as tmp:
            size = sum(f.stat().st_size for f in ovp.save(model, Path(tmp) / "m.xml", compress_to_fp16=False))
        runner = ovr.OpenVINORunner(model, precision=details["inference_precision"], threads=threads or None)
        out[label] = (runner, "fp32" if precision == "int8" and mode == "weights" else precision, len(model.get_ordered_ops()), size)
    return out


def auto_run(ir, opts, threads: int) -> tuple[dict, dict]:
    """auto's own run with `opts`, and its candidates within budget for the bench's rounds:
    (selection, {variant: (runner at `threads`, auto's row)})."""
    from modelport.optimize.auto import auto_select, build_candidates

    built = build_candidates(ir, opts)
    _, _, sel = auto_select(ir, opts, built=built)
    rows = {v["variant"]: v for v in sel["variants"]}
    return sel, {c["variant"]: (c["runner"](threads or None), rows[c["variant"]])
                 for c in built[0] if rows[c["variant"]]["within_budget"]}


def main(argv=None) -> int:
    import onnx

    from modelport.errors import ValidationError
    from modelport.optimize.model_tools import model_size, with_model
    from modelport.optimize.pipeline import OptimizeOptions, optimize_ir
    from modelport.orchestration.optimize_stage import DEFAULT_AUTO_BUDGET
    from modelport.parsers import SourceSpec, parse
    from modelport.runtimes.onnxruntime import OnnxRuntimeRunner
    from modelport.validation import check, tolerance_for

    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--threads", type=int, default=0, help="onnxruntime intra-op threads (0: its default)")
    ap.add_argument("--models", default="cnn,bert,gpt")
    ap.add_argument("--no-openvino", action="store_true", help="onnxruntime rows only")
    a = ap.parse_args(argv)
    import importlib.util

    with_ov = not a.no_openvino and importlib.util.find_spec("openvino") is not None
    threads = a.threads or None
    print(cpu_features(), flush=True)
    print("| model | variant | nodes | size MiB | latency ms (median) | speed-up vs raw | max abs | cosine |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    summary = []
    with tempfile.TemporaryDirectory() as d:
        folder = Path(d)
        for name in a.models.split(","):
            path = export(name, folder)
            ir = parse(path, SourceSpec(path=path, framework="onnx"))
            feeds = ir.reference.inputs
            variants = {"raw export": ir}
            import onnxsim

            variants["onnxsim"] = with_model(ir, onnxsim.simplify(onnx.load(str(path)))[0])
            variants["onnxruntime offline (extended)"] = with_model(ir, onnx.load(str(ort_offline(path, folder / f"{name}.ort.onnx"))))
            for level in ("basic", "extended", "all"):
                variants[f"modelport {level}"] = optimize_ir(ir, OptimizeOptions(level=level))[0]
            for label, precision in (("fp16 (extended)", "fp16"), ("int8 dynamic (extended)", "int8")):
                try:
                    variants[label] = optimize_ir(ir, OptimizeOptions(level="extended", precision=precision))[0]
                except ValidationError as e:  # not deliverable within its tolerance: say so, never time an FP32 model under its name
                    print(f"| {name} | {label} | | | | not delivered | {e.reason[:80]} | |", flush=True)
            # auto as `convert --optimize auto` runs it (the default budget), timed at the bench's threads;
            # its candidates within budget join the rounds below, so its choice can be checked against them
            autos = {"auto, onnxruntime": auto_run(ir, OptimizeOptions(level="auto", budget=DEFAULT_AUTO_BUDGET, bench_runs=a.runs,
                                                                        threads=threads), a.threads)}
            ov_rows: dict = {}
            if with_ov:
                calib = calibration_npz(ir, folder / f"{name}.calib.npz")
                ov_rows = openvino_variants(ir, calib, a.threads)
                autos["auto, both runtimes, --calibration"] = auto_run(
                    ir, OptimizeOptions(level="auto", runtimes=("onnxruntime", "openvino"), budget=DEFAULT_AUTO_BUDGET,
                                        calibration=str(calib), bench_runs=a.runs, threads=threads), a.threads)
            models = {k: v.model for k, v in variants.items()}
            if not any(n.op_type.startswith("Conv") for n in ir.model.graph.node):  # a CNN's work is in Conv
                floor, floor_feeds, n_gemms = gemm_floor(ir.model, feeds)
                models[f"GEMM floor ({n_gemms} weight GEMMs only)"] = floor
            runners = {k: OnnxRuntimeRunner(m, threads=threads, spinning=False) for k, m in models.items()}
            runners.update({k: r[0] for k, r in ov_rows.items()})
            for run, (_, cands) in autos.items():
                runners.update({f"{run}: {v}": r for v, (r, _) in cands.items()})
            run_feeds = {k: floor_feeds if k.startswith("GEMM floor") else feeds for k in runners}
            ms = interleaved_ms(runners, run_feeds, runs=a.runs)
            raw_ms = ms["raw export"]
            for label, (runner, prec, nodes, size) in ov_rows.items():
                p = check(runner, ir.reference, tolerance_for(prec), label)
                o = p.outputs[0]
                print(f"| {name} | {label} (runs at {runner.inference_precision}) | {nodes} | {size / 2**20:.2f} | {ms[label]:.2f} | "
                      f"{raw_ms / ms[label]:.2f}x | {o.max_abs:.2g} | {o.cosine:.6f} |", flush=True)
            for label, model in models.items():
                v = variants.get(label)
                if v is None:
                    print(f"| {name} | {label} | {len(model.graph.node)} | | {ms[label]:.2f} | "
                          f"{raw_ms / ms[label]:.2f}x (ceiling) | | |", flush=True)
                    continue
                prec = v.provenance.get("precision", "fp32")
                p = check(OnnxRuntimeRunner(v.model), ir.reference, tolerance_for(prec), label)
                o = p.outputs[0]
                print(f"| {name} | {label} | {len(v.model.graph.node)} | {model_size(v.model) / 2**20:.2f} | {ms[label]:.2f} | "
                      f"{raw_ms / ms[label]:.2f}x | {o.max_abs:.2g} | {o.cosine:.6f} |", flush=True)
            for run, (sel, cands) in autos.items():
                for variant, (_, row) in cands.items():
                    label = f"{run}: {variant}"
                    mark = " **(chosen)**" if row["chosen"] else ""
                    print(f"| {name} | {label}{mark} | {row['nodes']} | {row['size'] / 2**20:.2f} | {ms[label]:.2f} | "
                          f"{raw_ms / ms[label]:.2f}x | {row['max_abs']:.2g} | {row['cosine']:.6f} |", flush=True)
                fastest = min(cands, key=lambda v: ms[f"{run}: {v}"])
                chosen_ms, fastest_ms = ms[f"{run}: {sel['chosen']}"], ms[f"{run}: {fastest}"]
                auto_ms = next(v["latency_ms"] for v in sel["variants"] if v["chosen"])
                summary.append(f"| {name} | {run} | {sel['chosen']} | {auto_ms:.2f} | {chosen_ms:.2f} | {raw_ms / chosen_ms:.2f}x | "
                               f"{fastest} | {fastest_ms:.2f} | {chosen_ms / fastest_ms:.2f} | {len(cands)} of {len(sel['variants'])} |")
    print(f"\nauto's choice against its candidates within budget ({DEFAULT_AUTO_BUDGET}), all timed in the rounds above "
          f"(threads: {a.threads or 'default'}):\n")
    print("| model | auto run | chosen | its ms in auto's rounds | its ms here | speed-up vs raw | fastest within budget here | "
          "its ms | chosen / fastest | candidates within budget |")
    print("| --- | --- | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: |")
    print("\n".join(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
