"""Optimisation benchmark: node count, file size, onnxruntime CPU latency and parity, side by side.

Models (built locally, random init): a ResNet-18-sized CNN at 1x3x224x224, a BERT-like encoder
(4 layers, hidden 256, 4 heads) and a GPT-like decoder (4 layers, hidden 256), both at sequence
128. Variants: the raw torch.onnx export, onnxsim alone, onnxruntime's own offline optimisation
(ORT_ENABLE_EXTENDED, saved), modelport's levels, `auto`, FP16 and INT8 dynamic.

    .venv/bin/python bench/optimize_bench.py [--runs 20] [--models cnn,bert,gpt]
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


def main(argv=None) -> int:
    import onnx

    from modelport.convert.parity import DEFAULT_TOLERANCES, compare
    from modelport.optimize.auto import latency_ms
    from modelport.optimize.model_tools import model_size, with_model
    from modelport.optimize.pipeline import OptimizeOptions, optimize_ir
    from modelport.parsers import SourceSpec, parse

    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--models", default="cnn,bert,gpt")
    a = ap.parse_args(argv)
    print("| model | variant | nodes | size MiB | latency ms (median) | speed-up vs raw | max abs | cosine |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
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
            auto_ir, _, sel = optimize_ir(ir, OptimizeOptions(level="auto", bench_runs=a.runs))
            variants[f"modelport auto ({sel['chosen']})"] = auto_ir
            variants["fp16 (extended)"] = optimize_ir(ir, OptimizeOptions(level="extended", precision="fp16"))[0]
            variants["int8 dynamic (extended)"] = optimize_ir(ir, OptimizeOptions(level="extended", precision="int8"))[0]
            raw_ms = None
            for label, v in variants.items():
                from modelport.runtimes.onnxruntime import OnnxRuntimeRunner

                prec = v.provenance.get("precision", "fp32")
                p = compare(ir.reference.outputs, OnnxRuntimeRunner(v.model).run(feeds), DEFAULT_TOLERANCES[prec], hop=label)
                ms = latency_ms(v.model, feeds, runs=a.runs)
                raw_ms = raw_ms or ms
                o = p.outputs[0]
                print(f"| {name} | {label} | {len(v.model.graph.node)} | {model_size(v.model) / 2**20:.2f} | {ms:.2f} | "
                      f"{raw_ms / ms:.2f}x | {o.max_abs:.2g} | {o.cosine:.6f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
