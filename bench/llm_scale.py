"""Decoder LM conversion at scale: peak memory (whole process tree) and wall time of
`modelport convert --task text-generation` against onnxruntime-genai's model builder, on one
random-init folder built from a config (default: Qwen2.5-0.5B's, bf16 safetensors, 943 MB).

Rows, run in turn within each round (a burst of load on a shared machine hits every row alike):

    modelport fp32    modelport convert FOLDER --task text-generation -o OUT (model.onnx)
    builder fp32      python -m onnxruntime_genai.models.builder -i FOLDER -o OUT -p fp32 -e cpu
    modelport int4    ... --precision int4 --optimize all (block 32, symmetric)
    builder int4      ... -p int4
    modelport fp16    ... --precision fp16 --optimize all (with --precisions ...,fp16)
    builder fp16      ... -p fp16 (float16 weights, cache and logits; meant for GPUs, run here on the CPU)

Each command runs in its own process; a sampler reads the RSS of that process and all its children
every 0.2 s and keeps the largest sum (the tree's peak; `/usr/bin/time` only gives the largest single
process). modelport's wall time is split into conversion and validation from its report.json
(stages `validate:*` and `reference:*` are validation). Random weights leave int4 logits near-tied,
so the int4 rows pass `--accuracy-budget tokens>=0` and print the token agreement beside them. The
int4 and fp16 rows write an onnxruntime-genai folder (`--to ort-genai`, validated by generating with
onnxruntime-genai itself), and the folders of the precisions in --decode are then timed at decoding
with onnxruntime-genai (`DECODE`: 64 greedy tokens after a 16-token prompt, three times, one over the
median step time; one intra-op thread and onnxruntime's default); the builder's fp32 folder too when
fp32 is in --decode (modelport's fp32 row writes model.onnx alone), as the CPU figure fp16 is
compared with. `model MB` is the size of the model files written (model.onnx and its data file).

The source folder is written tensor by tensor into bf16 shards (`build_folder`), never holding the
model: `--preset 7b` (Qwen2.5-7B's shapes, 15.2 GB) fits on the 24 GiB machine beside the runs.
There modelport's default (`--reference auto`) streams its reference, the fp32 model not fitting;
`--reference streamed` asks for it at every size. `--memory-cap` (GiB, default 20: the 24 GiB
machine's budget) kills a row whose process tree passes it, and the row says so (exit -9): a
builder that would need more than the machine has is a row, not a machine brought down.

Usage: python bench/llm_scale.py [--preset 0.5b|1.5b|7b] [--layers 24 --hidden 896 --intermediate 4864 --heads 14 --kv-heads 2
                                  --vocab 151936 --rounds 1 --precisions fp32,int4[,fp16] --decode int4[,fp16,fp32]
                                  --work DIR --no-builder --reference auto|transformers|streamed --memory-cap 20]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

# Qwen2.5-0.5B's config.json (the shape; the weights are random)
QWEN25_05B = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                  num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768, rope_theta=1000000.0,
                  rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=151643, eos_token_id=151643,
                  use_sliding_window=False, sliding_window=32768, max_window_layers=21)


QWEN25_7B = dict(QWEN25_05B, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                 num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False, max_window_layers=28)
PRESETS = {"0.5b": QWEN25_05B, "1.5b": dict(QWEN25_05B, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                                            num_attention_heads=12, num_key_value_heads=2, max_window_layers=21),
           "7b": QWEN25_7B}
SHARD_BYTES = 2 << 30  # as `save_pretrained`'s default shard size, about


def build_folder(folder: Path, shard_bytes: int = SHARD_BYTES, **overrides) -> Path:
    """A random-init Qwen2 folder in bf16 safetensors shards (Qwen2.5-0.5B's config with `overrides`),
    written tensor by tensor: the model is never held (a 7 B folder is 15 GB), only the shard being
    filled; each tensor is drawn in row blocks, so not even one fp32 copy of the embedding is made.
    Weights N(0, 0.02), norms 1, seeded. Plus a small byte-level BPE tokenizer (the builder and
    onnxruntime-genai load one)."""
    import torch
    from safetensors.torch import save_file
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(**{**QWEN25_05B, **overrides}, torch_dtype="bfloat16")
    with torch.device("meta"):
        skeleton = Qwen2ForCausalLM(cfg)
    shapes = [(n, tuple(p.shape)) for n, p in skeleton.named_parameters()
              if not (cfg.tie_word_embeddings and n == "lm_head.weight")]
    del skeleton
    folder.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(0)
    shard: dict = {}
    filled, written, weight_map, total = 0, [], {}, 0

    def flush():
        nonlocal shard, filled
        if shard:
            path = folder / f"part-{len(written):05d}.safetensors"
            save_file(shard, str(path), metadata={"format": "pt"})
            written.append((path, list(shard)))
        shard, filled = {}, 0

    for name, shape in shapes:
        tensor = torch.empty(shape, dtype=torch.bfloat16)
        if "norm" in name:
            tensor.fill_(1.0)
        else:
            rows = max(1, (64 << 20) // (4 * math.prod(shape[1:])))
            for start in range(0, shape[0], rows):  # 64 MiB of fp32 at a time
                block = tensor[start:start + rows]
                block.copy_(torch.randn(block.shape, generator=generator).mul_(0.02))
        size = tensor.numel() * 2
        if filled and filled + size > shard_bytes:
            flush()
        shard[name] = tensor
        filled += size
        total += size
    flush()
    count = len(written)
    for k, (path, names) in enumerate(written):
        final = folder / f"model-{k + 1:05d}-of-{count:05d}.safetensors"
        path.rename(final)
        weight_map.update({n: final.name for n in names})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                     "weight_map": weight_map}, indent=2))
    cfg.architectures = ["Qwen2ForCausalLM"]
    cfg.save_pretrained(str(folder))
    GenerationConfig(do_sample=False, bos_token_id=cfg.bos_token_id, eos_token_id=cfg.eos_token_id).save_pretrained(str(folder))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(["the cat sat on the mat", "a dog ran in the park"] * 10,
                            trainers.BpeTrainer(vocab_size=256, special_tokens=["<pad>", "<s>", "</s>"]))
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "GPT2Tokenizer", "bos_token": "<s>",
                                                              "eos_token": "</s>", "pad_token": "<pad>"}))
    return folder


# decode tokens/s of an onnxruntime-genai folder, in a child: a 16-token prompt, then `steps` greedy
# tokens (end-of-sequence held off by min_length), three times; the rate is one over the median time of
# a decode step over all three (a burst of load on a shared machine moves a mean or a best run, hardly
# the median); `threads` 0 = onnxruntime's default
DECODE = """
import json, sys, time
import numpy as np
import onnxruntime_genai as og
folder, threads, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
config = og.Config(folder)
if threads:
    config.overlay(json.dumps({"model": {"decoder": {"session_options": {"intra_op_num_threads": threads,
                                                                          "inter_op_num_threads": 1}}}}))
model = og.Model(config)
prompt = np.arange(3, 19, dtype=np.int32)[None]
steps_s = []
for _ in range(3):
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=16 + steps + 1, min_length=16 + steps + 1, do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens(prompt)
    gen.generate_next_token()
    n = 0
    while not gen.is_done() and n < steps:
        start = time.perf_counter()
        gen.generate_next_token()
        steps_s.append(time.perf_counter() - start)
        n += 1
    del gen
print(json.dumps({"tokens_per_s": 1.0 / float(np.median(steps_s))}))
"""


def decode_rate(folder: Path, threads: int, env: dict, steps: int = 64) -> float | None:
    """Decode tokens/s of an onnxruntime-genai folder (None when it cannot run)."""
    proc = subprocess.run([sys.executable, "-c", DECODE, str(folder), str(threads), str(steps)], capture_output=True, text=True,
                          env=env)
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])["tokens_per_s"]
    except (IndexError, ValueError, KeyError):
        print(f"decode {folder} ({threads} threads) failed: {proc.stderr.strip().splitlines()[-1:]}", flush=True)
        return None


def tree_rss(proc) -> int:
    """RSS bytes of a psutil.Process and every descendant (0 once it is gone)."""
    import psutil

    total = 0
    try:
        procs = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


class TreePeak:
    """Samples the RSS of a process tree every `interval` seconds in a thread; `.peak` in bytes.
    `cap` (bytes): a tree that passes it is killed (SIGKILL, every process of it) and `.capped` set."""

    def __init__(self, pid: int, interval: float = 0.2, cap: int | None = None):
        import psutil

        self.proc, self.interval, self.peak, self.cap, self.capped = psutil.Process(pid), interval, 0, cap, False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, tree_rss(self.proc))
            if self.cap is not None and self.peak > self.cap and not self.capped:
                self.capped = True
                kill_tree(self.proc)
            self._stop.wait(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        return False


def kill_tree(proc) -> None:
    """SIGKILL a psutil.Process and its descendants."""
    import psutil

    try:
        procs = [*proc.children(recursive=True), proc]
    except psutil.Error:
        return
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass


KILLED = -9  # the exit code a row gets when its tree passed --memory-cap and was killed


def measured(cmd: list[str], log: Path, env: dict | None = None, cap: int | None = None) -> tuple[int, float, int]:
    """(exit code, wall seconds, peak RSS bytes of the process tree) of one command; a tree that
    passes `cap` bytes is killed and its exit code is KILLED."""
    started = time.perf_counter()
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        with TreePeak(proc.pid, cap=cap) as peak:
            rc = proc.wait()
    return (KILLED if peak.capped else rc), time.perf_counter() - started, peak.peak


def split_wall(report: Path) -> tuple[float | None, float | None]:
    """(conversion seconds, validation seconds) from modelport's report.json stage rows."""
    try:
        stages = json.loads(report.read_text()).get("stages", [])
    except (OSError, ValueError):
        return None, None
    check = sum(s.get("seconds") or 0.0 for s in stages if s["name"].startswith(("validate:", "reference:")))
    total = sum(s.get("seconds") or 0.0 for s in stages)
    return total - check, check


def stage_lines(report: Path) -> list[str]:
    """Each stage's wall time and the process tree's peak RSS during it, from report.json."""
    try:
        stages = json.loads(report.read_text()).get("stages", [])
    except (OSError, ValueError):
        return []
    return [f"    {s['name']:<28} {s.get('seconds') or 0:7.1f} s  {(s.get('peak_rss') or 0) / 1e9:6.2f} GB" for s in stages]


def least_cosine(report: Path) -> float | None:
    """The least `cosine_min` over modelport's generation entries (None when none reports one)."""
    try:
        gens = json.loads(report.read_text()).get("generation", [])
    except (OSError, ValueError):
        return None
    return min((g["cosine_min"] for g in gens if "cosine_min" in g), default=None)


def agreement(report: Path) -> float | None:
    try:
        gens = json.loads(report.read_text()).get("generation", [])
    except (OSError, ValueError):
        return None
    return min((g["token_agreement"] for g in gens), default=None)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), help="Qwen2.5 shapes (0.5b, 1.5b, 7b); the flags below override them")
    ap.add_argument("--layers", type=int, default=QWEN25_05B["num_hidden_layers"])
    ap.add_argument("--hidden", type=int, default=QWEN25_05B["hidden_size"])
    ap.add_argument("--intermediate", type=int, default=QWEN25_05B["intermediate_size"])
    ap.add_argument("--heads", type=int, default=QWEN25_05B["num_attention_heads"])
    ap.add_argument("--kv-heads", type=int, default=QWEN25_05B["num_key_value_heads"])
    ap.add_argument("--vocab", type=int, default=QWEN25_05B["vocab_size"])
    ap.add_argument("--rounds", type=int, default=1, help="interleaved rounds (the best of each row is kept)")
    ap.add_argument("--precisions", default="fp32,int4")
    ap.add_argument("--decode", default="int4", help="precisions whose ort-genai folders are timed at decoding")
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--no-builder", action="store_true")
    ap.add_argument("--memory-cap", type=float, default=20.0,
                    help="GiB: a run whose process tree passes it is killed and its row says so (the 24 GiB machine's budget)")
    ap.add_argument("--reference", default="auto",
                    help="modelport's --reference, comma-separated for a row each: auto (its default: streamed when the fp32 "
                         "model does not fit), transformers, streamed")
    a = ap.parse_args()

    import tempfile

    work = a.work or Path(tempfile.mkdtemp(prefix="llm_scale_"))
    src = work / "src"
    if not (src / "config.json").exists():
        given = {k: v for k, v in (("hidden_size", a.hidden), ("intermediate_size", a.intermediate), ("num_hidden_layers", a.layers),
                                   ("num_attention_heads", a.heads), ("num_key_value_heads", a.kv_heads), ("vocab_size", a.vocab))
                 if v != QWEN25_05B[k]}  # a flag left at its default leaves the preset's value
        build_folder(src, **{**PRESETS.get(a.preset or "0.5b", QWEN25_05B), **given})
    shape = json.loads((src / "config.json").read_text())
    checkpoint = sum(f.stat().st_size for f in src.glob("*.safetensors"))
    src_dir = str(Path(__file__).resolve().parents[1] / "src")  # this checkout's modelport
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MODELPORT_PROGRESS": "lines", "PYTHONPATH": os.pathsep.join(p for p in (src_dir, os.environ.get("PYTHONPATH")) if p)}
    rows: dict[str, dict] = {}
    cap = int(a.memory_cap * 2**30) if a.memory_cap else None
    precisions = [p for p in a.precisions.split(",") if p]
    references = [r for r in a.reference.split(",") if r]
    for _ in range(a.rounds):
        for precision in precisions:
            for reference in references:
                run_modelport(rows, src, work, precision, reference, a, env, cap)
            if not a.no_builder:
                run_builder(rows, src, work, precision, a, env, cap)
    print(f"\n{shape['num_hidden_layers']} layers, hidden {shape['hidden_size']}, intermediate {shape['intermediate_size']}, "
          f"heads {shape['num_attention_heads']}:{shape['num_key_value_heads']}, vocab {shape['vocab_size']}; checkpoint {checkpoint / 1e6:.0f} MB (bf16); best of {a.rounds} interleaved round(s); "
          "peak RSS of the process tree")
    print("| row | exit | wall s | convert s | validate s | peak RSS GB | x checkpoint | vs builder RSS | vs builder wall "
          "| vs builder convert | model MB | tokens | cosine min | cosine min, batch 1 | decode tok/s 1 thread "
          "| decode tok/s default | vs builder decode (1 / default) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    fmt = (lambda v, d=1: f"{v:.{d}f}" if isinstance(v, float) else "")  # noqa: E731
    for name, r in rows.items():
        base = rows.get(f"builder {r['precision']}") if name.startswith("modelport") else None
        base = base if base and base["rc"] == 0 else None  # a killed builder has no figures to compare with
        vs_rss = f"{r['peak'] / base['peak']:.2f}x" if base else ""
        vs_wall = f"{r['wall'] / base['wall']:.2f}x" if base else ""
        vs_convert = f"{r['convert'] / base['convert']:.2f}x" if base and r.get("convert") else ""
        vs_decode = ""
        if base and all(x.get(k) for x in (r, base) for k in ("decode_1", "decode_n")):
            vs_decode = f"{r['decode_1'] / base['decode_1']:.2f}x / {r['decode_n'] / base['decode_n']:.2f}x"
        print(f"| {name} | {r['rc']} | {r['wall']:.1f} | {fmt(r.get('convert'))} | {fmt(r.get('validate'))} | "
              f"{r['peak'] / 1e9:.2f} | {r['peak'] / checkpoint:.1f} | {vs_rss} | {vs_wall} | {vs_convert} | "
              f"{(r.get('size') or 0) / 1e6:.0f} | {fmt(r.get('tokens'), 2)} | {fmt(r.get('cosine'), 3)} | {fmt(r.get('alone'), 3)} | "
              f"{fmt(r.get('decode_1'))} | {fmt(r.get('decode_n'))} | {vs_decode} |")
    if any(r["rc"] == KILLED for r in rows.values()):
        print(f"exit {KILLED}: the process tree passed --memory-cap {a.memory_cap:g} GiB and was killed (its peak is the last sample)")
    return 0 if all(r["rc"] == 0 for r in rows.values()) else 1


def run_modelport(rows: dict, src: Path, work: Path, precision: str, reference: str, a, env: dict, cap: int | None) -> None:
    """One modelport row: convert with `--reference reference` (its name says which unless auto)."""
    name = f"modelport {precision}" + ("" if reference == "auto" else f" {reference}")
    out = work / name.replace(" ", "_")
    cmd = [sys.executable, "-m", "modelport", "convert", str(src), "--task", "text-generation", "-o", str(out),
           "--force", "--json", "--reference", reference]
    if precision != "fp32":  # as the builder writes it: an onnxruntime-genai folder, generated from there
        cmd += ["--precision", precision, "--optimize", "all", "--accuracy-budget", "tokens>=0", "--to", "ort-genai"]
    rc, wall, peak = measured(cmd, work / f"{out.name}.log", env, cap)
    convert_s, check_s = split_wall(out / "report.json")
    print(f"{name}: exit {rc}, {wall:.1f} s, peak {peak / 1e9:.2f} GB", *stage_lines(out / "report.json"), sep="\n", flush=True)
    keep(rows, name, rc, wall, peak, precision=precision, convert=convert_s, validate=check_s,
         tokens=agreement(out / "report.json"), cosine=least_cosine(out / "report.json"),
         alone=judged_cosine(out / "ort-genai", src, env) if rc == 0 and precision != "fp32" else None,
         size=model_bytes(out / "ort-genai" if precision != "fp32" else out), **decode_rates(out / "ort-genai", precision, a, env))


def run_builder(rows: dict, src: Path, work: Path, precision: str, a, env: dict, cap: int | None) -> None:
    """One row of onnxruntime-genai's model builder at `precision` (CPU)."""
    out = work / f"builder_{precision}"
    cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(src), "-o", str(out), "-p", precision,
           "-e", "cpu", "-c", str(work / "cache")]
    rc, wall, peak = measured(cmd, work / f"builder_{precision}.log", env, cap)
    print(f"builder {precision}: exit {rc}, {wall:.1f} s, peak {peak / 1e9:.2f} GB", flush=True)
    keep(rows, f"builder {precision}", rc, wall, peak, precision=precision, convert=wall, size=model_bytes(out),
         alone=judged_cosine(out, src, env) if rc == 0 and precision != "fp32" else None,
         **(decode_rates(out, precision, a, env) if rc == 0 else {}))


JUDGE = """
import json, sys
from pathlib import Path
import onnx
from modelport.parsers.hf_decoder_config import read_decoder_config
from modelport.validation.generation import fixed_prompts
from modelport.validation.streamed_reference import judge_streamed
folder, src = Path(sys.argv[1]), Path(sys.argv[2])
cfg = read_decoder_config(src)
graph = onnx.load(str(folder / "model.onnx"), load_external_data=False)
for i in graph.graph.input:  # a cache dim left symbolic (the builder's kv_cache_dim) given its size
    dims = i.type.tensor_type.shape.dim
    if i.name.startswith("past_key_values.") and len(dims) == 4 and not dims[3].HasField("dim_value"):
        dims[3].dim_value = cfg.head_dim
model = folder / "judged.onnx"  # beside the original: its external data is found by the same relative path
onnx.save(graph, str(model))
cosines = []
for prompt in fixed_prompts(cfg.vocab_size, avoid=(cfg.safe_pad,)):  # each prompt alone: no padding to disagree on
    result, _ = judge_streamed(model, src, [prompt], 32, cfg.safe_pad, hop="judged", precision="int4")
    cosines.append(result.details["cosine_min"])
model.unlink()
print(json.dumps({"cosine_min": min(cosines)}))
"""


def judged_cosine(folder: Path, src: Path, env: dict) -> float | None:
    """The least logit cosine of an onnxruntime-genai folder's model at its own greedy context against
    modelport's streamed reference, each prompt alone (batch 1): the same check for modelport's
    folder and the builder's, the peer for what int4 keeps of random weights."""
    proc = subprocess.run([sys.executable, "-c", JUDGE, str(folder), str(src)], capture_output=True, text=True, env=env)
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1])["cosine_min"]
    except (IndexError, ValueError, KeyError):
        print(f"judging {folder} failed: {proc.stderr.strip().splitlines()[-1:]}", flush=True)
        return None


def model_bytes(folder: Path) -> int:
    """Bytes of the model files in an output folder (model.onnx and its data file)."""
    return sum(f.stat().st_size for f in folder.glob("model.onnx*")) if folder.is_dir() else 0


def decode_rates(folder: Path, precision: str, a, env: dict) -> dict:
    """{"decode_1": tokens/s with one thread, "decode_n": with onnxruntime's default} of an ort-genai
    folder, for the precisions of --decode (none for the others)."""
    if precision not in a.decode.split(",") or not (folder / "genai_config.json").is_file():
        return {}
    return {"decode_1": decode_rate(folder, 1, env), "decode_n": decode_rate(folder, 0, env)}


def keep(rows: dict, name: str, rc: int, wall: float, peak: int, **extra) -> None:
    """Keep the best (lowest) wall and peak of a row over the rounds; a failed run is kept as failed."""
    old = rows.get(name)
    row = {"rc": rc, "wall": wall, "peak": peak, **extra}
    if old is not None:
        row = {**row, "rc": max(old["rc"], rc), "wall": min(old["wall"], wall), "peak": min(old["peak"], peak)}
        for k in ("convert", "validate"):
            if old.get(k) is not None and row.get(k) is not None:
                row[k] = min(old[k], row[k])
        for k in ("decode_1", "decode_n"):  # rates: the best is the highest
            if old.get(k) is not None and row.get(k) is not None:
                row[k] = max(old[k], row[k])
    rows[name] = row


if __name__ == "__main__":
    sys.exit(main())
