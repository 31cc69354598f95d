"""Decoder LM benchmark: prefill latency and decode tokens/s of modelport's text-generation outputs
against onnxruntime-genai's own model builder, all run by onnxruntime-genai on the CPU.

A random-init Llama-style folder (default 8 layers, hidden 512, GQA 8:2, vocabulary 32000) is
built once; rows:

    raw export      modelport's KV-cache export as torch.onnx writes it (fp32)
    fp32-fused      --optimize all
    int8, int4      weight-only MatMulNBits (block 32, symmetric) on the fused model
    builder fp32    python -m onnxruntime_genai.models.builder -p fp32 -e cpu, from the same folder
    builder int4    the same with -p int4

Each row prefills a 128-token prompt (batch 1) and decodes 64 tokens greedily, after one warm-up, in
--rounds rounds that alternate the rows (a burst of load on a shared machine then hits every row
alike); the table gives each row's best prefill and best decode rate, and beside it the agreement
of its 64 tokens with the raw export's (position by position).
Usage: python bench/llm_bench.py [--layers 8 --hidden 512 --vocab 32000 --threads 1 --rounds 5 --work DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def build_folder(folder: Path, layers: int, hidden: int, vocab: int) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    heads = hidden // 64
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=int(hidden * 2.75) // 64 * 64,
                      num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=max(1, heads // 4),
                      max_position_embeddings=1024, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    LlamaForCausalLM(cfg).eval().save_pretrained(str(folder))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(["the cat sat on the mat", "a dog ran in the park"] * 10,
                            trainers.BpeTrainer(vocab_size=256, special_tokens=["<pad>", "<s>", "</s>"]))
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "GPT2Tokenizer", "bos_token": "<s>",
                                                              "eos_token": "</s>", "pad_token": "<pad>"}))


def set_threads(folder: Path, threads: int) -> None:
    cfg_path = folder / "genai_config.json"
    cfg = json.loads(cfg_path.read_text())
    opts = cfg["model"]["decoder"].setdefault("session_options", {})
    opts.update(intra_op_num_threads=threads, inter_op_num_threads=1)
    cfg_path.write_text(json.dumps(cfg, indent=2))


class GenaiRow:
    """One folder loaded by onnxruntime-genai; `once()` prefills the prompt and decodes greedily."""

    def __init__(self, folder: Path, prompt: list[int], new_tokens: int):
        import onnxruntime_genai as og

        self.og, self.model, self.prompt, self.new_tokens = og, og.Model(str(folder)), prompt, new_tokens

    def once(self) -> tuple[float, float, list[int]]:
        """(prefill ms, decode tokens/s, generated tokens)."""
        prompt, new_tokens = self.prompt, self.new_tokens
        params = self.og.GeneratorParams(self.model)
        # min_length: never stop early at the end-of-sequence id, so every row decodes as many tokens
        params.set_search_options(max_length=len(prompt) + new_tokens, min_length=len(prompt) + new_tokens, do_sample=False)
        gen = self.og.Generator(self.model, params)
        t0 = time.perf_counter()
        gen.append_tokens(np.array([prompt], dtype=np.int32))
        gen.generate_next_token()
        t1 = time.perf_counter()
        out = [int(gen.get_next_tokens()[0])]
        while len(out) < new_tokens and not gen.is_done():
            gen.generate_next_token()
            out.append(int(gen.get_next_tokens()[0]))
        t2 = time.perf_counter()
        return (t1 - t0) * 1e3, (len(out) - 1) / (t2 - t1), out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds per row (the best is reported)")
    ap.add_argument("--no-builder", action="store_true")
    a = ap.parse_args()

    from modelport.emitters.ort_genai import write_folder
    from modelport.optimize.decoder_fusion import fuse_decoder
    from modelport.optimize.weight_only import WeightOnlyOptions, quantize_weight_only
    from modelport.parsers import hf_decoder

    work = a.work or Path(tempfile.mkdtemp(prefix="llm_bench_"))
    src = work / "src"
    if not (src / "config.json").exists():
        src.mkdir(parents=True, exist_ok=True)
        build_folder(src, a.layers, a.hidden, a.vocab)
    cfg = hf_decoder.read_decoder_config(src)
    t = time.perf_counter()
    raw, cfg = hf_decoder.export_decoder(src)
    print(f"export {time.perf_counter() - t:.1f}s", file=sys.stderr)
    fused, details = fuse_decoder(raw, context_length=cfg.context_length)
    variants = {"raw export (fp32)": raw, "modelport fp32-fused": fused}
    for name, bits in (("modelport int8", 8), ("modelport int4", 4)):
        variants[name], _ = quantize_weight_only(fused, WeightOnlyOptions(bits=bits, block_size=32, symmetric=True))
    folders = {}
    for name, model in variants.items():
        folder = work / name.replace(" ", "_").replace("(", "").replace(")", "")
        shutil.rmtree(folder, ignore_errors=True)
        write_folder(model, cfg.to_dict(), src, folder)
        folders[name] = folder
    if not a.no_builder:
        for precision in ("fp32", "int4"):
            folder = work / f"builder_{precision}"
            if not (folder / "genai_config.json").exists():
                env = {**os.environ, "HF_HUB_OFFLINE": "1"}
                subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(src), "-o", str(folder),
                                "-p", precision, "-e", "cpu", "-c", str(work / "cache")], check=True, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            folders[f"builder {precision}"] = folder
    for folder in folders.values():
        set_threads(folder, a.threads)

    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.integers(3, cfg.vocab_size, a.prompt)]
    runners = {name: GenaiRow(folder, prompt, a.new_tokens) for name, folder in folders.items()}
    for r in runners.values():
        r.once()  # warm-up
    best: dict[str, tuple[float, float, list[int]]] = {}
    for _ in range(a.rounds):  # rows alternate, so a burst of load on the machine hits them alike
        for name, r in runners.items():
            prefill, tps, tokens = r.once()
            old = best.get(name)
            best[name] = (min(prefill, old[0]) if old else prefill, max(tps, old[1]) if old else tps, tokens)
    rows, base = [], None
    for name, folder in folders.items():
        prefill, tps, tokens = best[name]
        base = base or tokens
        agree = float(np.mean([x == y for x, y in zip(tokens, base, strict=False)]))
        size = sum(f.stat().st_size for f in folder.glob("*.onnx*")) / 2**20
        rows.append((name, prefill, tps, agree, size))
    print(f"\n{a.layers} layers, hidden {a.hidden}, GQA {cfg.num_heads}:{cfg.kv_heads}, vocab {cfg.vocab_size}; "
          f"prompt {a.prompt}, {a.new_tokens} new tokens, batch 1, {a.threads} thread(s), onnxruntime-genai; "
          f"best of {a.rounds} interleaved rounds")
    print("| model | prefill ms | decode tok/s | vs raw | tokens = raw | size MiB |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    raw_tps = rows[0][2]
    for name, prefill, tps, agree, size in rows:
        print(f"| {name} | {prefill:.1f} | {tps:.1f} | {tps / raw_tps:.2f}x | {agree:.2f} | {size:.1f} |")
    print(f"\nfusions: {details['fused']} (nodes {details['nodes_before']} -> {details['nodes']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
