"""`--optimize auto` for decoder LMs (`convert --task text-generation`): build the variants, judge
each by generation, time them all on this CPU in onnxruntime, and keep the one that decodes
fastest among those that pass.

Variants are {unfused, fused} × precisions, named `fp32`, `fp32-fused`, `int8`, `int8-fused`,
`int4`, `int4-fused`: the fused ones go through onnxruntime's decoder fusions
(`optimize/decoder_fusion.py`), the int8/int4 ones through weight-only `MatMulNBits`
(`optimize/weight_only.py`), fused before quantised. Which precisions compete is the caller's
choice (`--precision X`: X alone, fused against unfused; `--precision auto`: fp32, int8 and int4).

Each variant is judged by the caller's `judge` (the same generation check as every artifact of
the route: fp32 exact, int8/int4 by teacher-forced token agreement and worst logit error against
the budget). A variant that fails its check, or cannot be built or loaded, stays in the table
with its reason and is never kept; when none passes there is no choice and the caller fails.

Timing, per variant, in one onnxruntime CPU session each, on one fixed prompt (batch 1,
`prompt_tokens` tokens, capped so that prompt and decoded tokens fit the model's positions):
the prefill (the first step of `validation.generation.generate_onnx`, empty cache) in ms, and
decode tokens/s over the `decode_steps` steps after it (one token each, `present.*` fed back).
Variants are interleaved round by round (after `warmup` untimed rounds), so a noisy stretch of
the machine slows every variant alike, and each figure is the median over `rounds`. The sessions'
threads do not spin-wait after a run: with onnxruntime's default spinning, the threads of the
variant timed just before keep the cores busy while the next one runs (four sessions of one
identical model, interleaved on a 2-core machine, decoded at 0.9k to 1.3k tokens/s with spinning,
2.7k to 3.9k without). Decode
tokens/s ranks the variants (a decoder's time is spent decoding); prefill is reported beside
it. Every measurement goes through one function, `timer(row, run)`: `run()` generates once and
returns `{"prefill_ms", "decode_tok_s"}` measured on the wall clock; a test passes a timer that
returns fixed figures to make the choice deterministic.
"""

from __future__ import annotations

import statistics
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from modelport.errors import BadInputError, MissingDependencyError, ModelportError, one_line
from modelport.onnxfile.onnx_io import save_onnx
from modelport.validation.generation import fixed_prompts, generate_onnx, onnx_session

# timer(variant row, run) -> {"prefill_ms": float, "decode_tok_s": float}; `run()` generates once and returns those, measured
DecoderTimer = Callable[[dict, Callable[[], dict]], dict]
# judge(variant name, precision, model path, onnxruntime session) -> validation.generation.GenerationResult
Judge = Callable[[str, str, Path, object], object]


@dataclass(frozen=True)
class DecoderAutoOptions:
    """How decoder variants are timed: prompt length, decode steps, timed and untimed rounds, the timer."""

    prompt_tokens: int = 128
    decode_steps: int = 32
    rounds: int = 5
    warmup: int = 1
    timer: DecoderTimer | None = None  # None: the wall clock (`run()` as it is)

    def __post_init__(self):
        for name in ("prompt_tokens", "decode_steps", "rounds"):
            if getattr(self, name) < 1:
                raise BadInputError(f"bad decoder auto {name} {getattr(self, name)}: at least 1")
        if self.warmup < 0:
            raise BadInputError(f"bad decoder auto warmup {self.warmup}: 0 or more")


@dataclass
class Variant:
    name: str
    precision: str
    fused: bool
    model: object | None = None  # ModelProto; None when it could not be built
    row: dict = field(default_factory=dict)


def variant_name(precision: str, fused: bool) -> str:
    return f"{precision}-fused" if fused else precision


def build_variants(model, precisions: Sequence[str], quantize: Callable[[object, str], tuple[object, dict]], *,
                   fuse: Callable[[object], tuple[object, dict]], on_stage=None) -> tuple[list[Variant], dict]:
    """Every {unfused, fused} × `precisions` variant of `model` (those that could not be built carry
    their reason), and the fusion's details. `quantize(model, precision)` returns (model, details)."""
    fusion: dict = {}
    bases: dict[bool, object | None] = {False: model}
    try:
        if on_stage:
            on_stage("optimize:auto:fuse")
        bases[True], fusion = fuse(model)
    except MissingDependencyError:
        raise
    except Exception as e:
        bases[True], fusion = None, {"error": _why(e)}
    variants = []
    for precision in precisions:
        for is_fused in (False, True):
            v = Variant(variant_name(precision, is_fused), precision, is_fused)
            base = bases[is_fused]
            v.row = {"variant": v.name, "precision": precision, "fused": is_fused}
            if base is None:
                v.row["reason"] = f"fusion failed: {fusion['error']}"
            elif precision == "fp32":
                v.model = base
            else:
                if on_stage:
                    on_stage(f"optimize:auto:quantize:{v.name}")
                try:
                    v.model, details = quantize(base, precision)
                    v.row["quantized"] = details.get("quantized")
                except MissingDependencyError:
                    raise
                except Exception as e:
                    v.row["reason"] = f"quantisation failed: {_why(e)}"
            if v.model is not None:
                v.row["nodes"] = len(v.model.graph.node)
            variants.append(v)
    return variants, fusion


def select(variants: list[Variant], judge: Judge, *, pad: int, vocab_size: int, context_length: int,
           options: DecoderAutoOptions = DecoderAutoOptions(), on_stage=None) -> dict:
    """Judge and time every built variant; returns the selection: `chosen` (a name, or None when
    none passes), `variants` (one row each, in order, `chosen` marked) and the timing set-up."""

    prompt_tokens, steps = bench_lengths(options, context_length)
    (prompt,) = fixed_prompts(vocab_size, lengths=(prompt_tokens,), avoid=(pad,))
    sessions = {}
    with tempfile.TemporaryDirectory(prefix="modelport-decoder-auto-") as tmp:
        for v in variants:
            if v.model is None:
                continue
            if on_stage:
                on_stage(f"optimize:auto:check:{v.name}")
            try:
                path = Path(tmp) / v.name / "model.onnx"
                path.parent.mkdir()
                save_onnx(v.model, path)
                v.row["size"] = sum(f.stat().st_size for f in path.parent.iterdir())
                session = onnx_session(path, spinning=False)  # see the module docstring
            except MissingDependencyError:
                raise
            except Exception as e:
                v.row["reason"] = f"onnxruntime cannot load it: {_why(e)}"
                continue
            try:
                result = judge(v.name, v.precision, path, session)
            except MissingDependencyError:
                raise
            except Exception as e:
                v.row["reason"] = f"generation failed: {_why(e)}"
                continue
            v.row.update(token_agreement=round(result.tokens, 6), max_abs=float(result.max_abs), budget=result.budget,
                         within_budget=bool(result.ok))
            if not result.ok:
                v.row["reason"] = result.reason
            sessions[v.name] = session
        figures = time_sessions(sessions, prompt, steps, pad, options, on_stage=on_stage)
    rows = [v.row for v in variants]
    for row in rows:
        row.setdefault("within_budget", False)
        row.update(figures.get(row["variant"], {"prefill_ms": None, "decode_tok_s": None}))
    passing = [r for r in rows if r["within_budget"]]
    chosen = max(passing, key=lambda r: r["decode_tok_s"]) if passing else None
    base = rows[0].get("decode_tok_s")
    for row in rows:
        row["chosen"] = row is chosen
        tok_s = row.get("decode_tok_s")
        row["decode_speedup"] = round(tok_s / base, 3) if tok_s and base else None
        if row["within_budget"] and row is not chosen:
            row["reason"] = f"decodes slower than {chosen['variant']}"
        row.setdefault("reason", None)
    return {"chosen": chosen["variant"] if chosen else None, "ranked_by": "decode_tok_s", "prompt_tokens": prompt_tokens,
            "decode_steps": steps, "rounds": options.rounds, "variants": rows}


def bench_lengths(options: DecoderAutoOptions, context_length: int) -> tuple[int, int]:
    """(prompt tokens, decode steps) of the timed generation: as asked, cut so that the prompt, the
    token the prefill yields and every decoded one fit the model's positions (decode first)."""
    steps = max(1, min(options.decode_steps, context_length - 2))
    return max(1, min(options.prompt_tokens, context_length - steps - 1)), steps


def time_sessions(sessions: dict, prompt: list[int], steps: int, pad: int, options: DecoderAutoOptions, *,
                  on_stage=None) -> dict[str, dict]:
    """{name: {"prefill_ms", "decode_tok_s"}}: medians over `options.rounds` rounds, the sessions
    interleaved within each round, after `options.warmup` untimed rounds."""

    def runner(session):
        def run() -> dict:
            seconds: list[float] = []
            generate_onnx(None, [prompt], steps + 1, pad, session=session, step_seconds=seconds)
            decode = sum(seconds[1:])
            return {"prefill_ms": seconds[0] * 1000.0, "decode_tok_s": steps / decode if decode > 0 else float("inf")}

        return run

    runs = {name: runner(s) for name, s in sessions.items()}
    timer = options.timer or (lambda row, run: run())
    samples: dict[str, list[dict]] = {name: [] for name in sessions}
    if on_stage and sessions:
        on_stage("optimize:auto:time")
    for _ in range(options.warmup):
        for run in runs.values():
            run()
    for index in range(options.rounds):
        for name, run in runs.items():
            samples[name].append(timer({"variant": name, "round": index, "prompt_tokens": len(prompt), "decode_steps": steps},
                                       run))
    return {name: {"prefill_ms": round(statistics.median(float(s["prefill_ms"]) for s in got), 3),
                   "decode_tok_s": round(statistics.median(float(s["decode_tok_s"]) for s in got), 3)}
            for name, got in samples.items()}


def _why(e: Exception) -> str:
    if isinstance(e, ModelportError):
        return e.message
    return one_line(e, 300, typed=True)
