"""Validation by generation: greedy-decode with the ONNX model and compare with `transformers`.

A decoder that matches its source on one forward pass can still generate differently: a cache
written at the wrong position, a mask that ignores left padding or a rotary table cut short only
shows over many steps. So the check is the one a user makes: from fixed prompts (a left-padded
batch of different lengths), decode N tokens greedily with our own loop over the ONNX model in
onnxruntime (every step's `present.*` fed back as the next `past_key_values.*`), and compare with
`transformers` `generate(do_sample=False)` on the same weights, step by step:

- `tokens`: the fraction of generated positions whose token equals the reference's;
- `max_abs`: the worst logit error over the steps whose context still equals the reference's
  (after a row's first different token the two runs see different text, so their logits are not
  comparable; `first_divergence` says where that happened per prompt).

FP32 must give identical tokens and logits within the scaled tolerance; a quantised model is
judged against a budget (`tokens>=0.95`, `max_abs<=2`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from modelport.errors import BadInputError, ValidationError
from modelport.validation.budget import BudgetKey, parse_clauses

DEFAULT_NEW_TOKENS = 32
PROMPT_LENGTHS = (7, 4, 1)  # one left-padded batch: rows of different lengths, one a single token
GENERATION_BUDGET_KEYS = (BudgetKey("tokens", ">=", ("token_agreement",), 0.0, 1.0), BudgetKey("max_abs", "<=", ("logits", "abs"), 0.0),
                          BudgetKey("cosine", ">=", ("cosine_min",), -1.0, 1.0))


@dataclass(frozen=True)
class GenerationBudget:
    """What a generating artifact must reach: token agreement and (optionally) the worst logit error."""

    min_tokens: float = 1.0
    max_abs: float | None = None  # None: the precision's scaled tolerance (fp32) or no bound (quantised)
    min_cosine: float | None = None  # the least cosine similarity of a compared step's logits with the reference's

    def describe(self) -> str:
        parts = [f"tokens>={self.min_tokens:g}"]
        if self.max_abs is not None:
            parts.append(f"max_abs<={self.max_abs:g}")
        if self.min_cosine is not None:
            parts.append(f"cosine>={self.min_cosine:g}")
        return ", ".join(parts)


def parse_generation_budget(text: str | None) -> GenerationBudget | None:
    """`tokens>=0.95`, `max_abs<=2.0`, `cosine>=0.99`, or several comma-separated."""
    if not text:
        return None
    values = parse_clauses(text, GENERATION_BUDGET_KEYS,
                           f"bad --accuracy-budget '{text}' for text generation: use tokens>=0.95, max_abs<=2.0 and/or cosine>=0.99")
    return GenerationBudget(min_tokens=values.get("tokens", 1.0), max_abs=values.get("max_abs"), min_cosine=values.get("cosine"))


def fixed_prompts(vocab_size: int, *, seed: int = 0, lengths=PROMPT_LENGTHS, avoid: tuple[int, ...] = ()) -> list[list[int]]:
    """Deterministic token-id prompts (ids in range, none of `avoid`, e.g. the pad id)."""
    rng = np.random.default_rng(seed + 1234)
    ok = np.array([i for i in range(vocab_size) if i not in set(avoid)])
    return [[int(t) for t in rng.choice(ok, size=n)] for n in lengths]


def left_padded(prompts: list[list[int]], pad: int) -> tuple[np.ndarray, np.ndarray]:
    """(input_ids, attention_mask) of a left-padded batch."""
    width = max(len(p) for p in prompts)
    ids = np.full((len(prompts), width), pad, dtype=np.int64)
    mask = np.zeros((len(prompts), width), dtype=np.int64)
    for r, p in enumerate(prompts):
        ids[r, width - len(p):] = p
        mask[r, width - len(p):] = 1
    return ids, mask


@dataclass
class Generation:
    """Greedy tokens [batch, steps] and the logits each step chose from [batch, steps, vocab]."""

    tokens: np.ndarray
    logits: np.ndarray
    producer: str = ""


def generate_transformers(model, prompts: list[list[int]], new_tokens: int, pad: int) -> Generation:
    """`generate(do_sample=False)` with no stopping token and no logits processors: raw greedy."""
    import torch
    from transformers import GenerationConfig

    ids, mask = left_padded(prompts, pad)
    config = GenerationConfig(do_sample=False, max_new_tokens=new_tokens, min_new_tokens=None, eos_token_id=None,
                              pad_token_id=pad, num_beams=1, use_cache=True)
    saved = model.generation_config
    model.generation_config = config  # else its eos_token_id (generation_config.json) is merged back in and stops rows
    try:
        with torch.no_grad():
            out = model.generate(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask),
                                 generation_config=config, output_logits=True, return_dict_in_generate=True)
    finally:
        model.generation_config = saved
    tokens = out.sequences[:, ids.shape[1]:].numpy()
    logits = torch.stack(list(out.logits), dim=1).float().numpy()
    import transformers

    return Generation(tokens=tokens, logits=logits, producer=f"transformers {transformers.__version__}")


def cache_shapes(session) -> tuple[list[str], list[str], dict[str, tuple[int, int]], np.dtype]:
    """(past input names, present output names, past name -> (kv_heads, head_dim), cache dtype) of a session."""
    past = [i for i in session.get_inputs() if i.name.startswith("past_key_values.")]
    if not past:
        raise BadInputError("the model has no past_key_values.* inputs: not a decoder with a KV cache")
    shapes = {}
    for i in past:
        heads, dim = i.shape[1], i.shape[3]
        if not isinstance(heads, int) or not isinstance(dim, int):
            raise BadInputError(f"cache input {i.name} has no fixed heads/head_dim: {i.shape}")
        shapes[i.name] = (heads, dim)
    dtype = np.float16 if "float16" in past[0].type else np.float32
    presents = ["present." + n[len("past_key_values."):] for n in (i.name for i in past)]
    return [i.name for i in past], presents, shapes, dtype


def onnx_session(model_path: str | Path, *, spinning: bool = True):
    """An onnxruntime CPU session of a model file, with onnxruntime's default graph optimisations (as a user runs it).

    `spinning=False`: the intra-op threads sleep as soon as a run ends instead of spinning for more
    work; sessions timed in turn then do not take CPU from one another."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if not spinning:
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(model_path), opts, providers=["CPUExecutionProvider"])


def generate_onnx(model_path: str | Path | None, prompts: list[list[int]], new_tokens: int, pad: int, *,
                  session=None, forced: np.ndarray | None = None, step_seconds: list[float] | None = None) -> Generation:
    """Greedy decoding with our own loop over a KV-cache ONNX model in onnxruntime: prefill the
    left-padded prompts with an empty past, then one token per step, feeding `present.*` back.

    `forced` [batch, steps] (teacher forcing): feed these tokens instead of our own choices, so
    every step sees the reference's context; `tokens` are still what the model would choose.
    `step_seconds`: the wall time of each step (the first is the prefill) is appended to it."""
    import time

    import onnxruntime as ort

    if session is None:
        session = onnx_session(model_path)
    past_names, present_names, shapes, dtype = cache_shapes(session)
    ids, mask = left_padded(prompts, pad)
    batch = ids.shape[0]
    past = {n: np.zeros((batch, h, 0, d), dtype=dtype) for n, (h, d) in shapes.items()}
    positions = np.cumsum(mask, axis=1) - 1
    positions[mask == 0] = 1  # padded slots: masked out; transformers gives them position 1 too
    tokens, step_logits = [], []
    outputs = ["logits", *present_names]
    takes = {i.name for i in session.get_inputs()}  # a graph that derives positions from the mask takes none
    for _ in range(new_tokens):
        started = time.perf_counter()
        feeds = {"input_ids": ids, "attention_mask": mask, "position_ids": positions.astype(np.int64), **past}
        got = session.run(outputs, {k: v for k, v in feeds.items() if k in takes})
        last = got[0][:, -1, :].astype(np.float32)
        nxt = last.argmax(axis=-1).astype(np.int64)
        tokens.append(nxt)
        step_logits.append(last)
        past = dict(zip(past_names, got[1:], strict=True))
        ids = (nxt if forced is None else forced[:, len(tokens) - 1].astype(np.int64))[:, None]
        positions = (mask.sum(axis=1, keepdims=True)).astype(np.int64)
        mask = np.concatenate([mask, np.ones((batch, 1), dtype=np.int64)], axis=1)
        if step_seconds is not None:
            step_seconds.append(time.perf_counter() - started)
    return Generation(tokens=np.stack(tokens, axis=1), logits=np.stack(step_logits, axis=1),
                      producer=f"onnxruntime {ort.__version__}")


@dataclass
class GenerationResult:
    """One artifact's generation compared with the reference, as it goes into report.json."""

    hop: str
    precision: str
    new_tokens: int
    prompts: int
    tokens: float  # agreement rate over all generated positions
    max_abs: float  # worst logit error over the steps whose context still agrees
    first_divergence: list[int | None]
    budget: str
    ok: bool
    reason: str | None = None
    details: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"hop": self.hop, "precision": self.precision, "new_tokens": self.new_tokens, "prompts": self.prompts,
                "token_agreement": round(self.tokens, 6), "max_abs": float(self.max_abs),
                "first_divergence": self.first_divergence, "budget": self.budget, "ok": self.ok, "reason": self.reason,
                **self.details}

    def raise_if_failed(self, path=None) -> None:
        if not self.ok:
            raise ValidationError(f"{self.hop}: {self.reason}", path=path)


def compare_generation(reference: Generation, got: Generation, *, hop: str, precision: str = "fp32",
                       budget: GenerationBudget | None = None, atol: float = 1e-4, rtol: float = 1e-3,
                       forced: bool = False) -> GenerationResult:
    """Judge `got` against `reference`. FP32 without a budget: identical tokens and every compared
    logit within `atol * max(1, max|ref|) + rtol * |ref|` (the project's scaled tolerance).

    `forced`: `got` was decoded with the reference's tokens fed back (teacher forcing), so every
    step's logits are comparable and the agreement is top-1 agreement step by step."""
    ref_t, got_t = reference.tokens, got.tokens
    if ref_t.shape != got_t.shape:
        return GenerationResult(hop, precision, ref_t.shape[1], ref_t.shape[0], 0.0, float("inf"), [], "", False,
                                f"generated shape {list(got_t.shape)} != reference {list(ref_t.shape)}")
    valid = got_t >= 0  # -1: the runtime stopped the row early (at an end-of-sequence token)
    same = (ref_t == got_t) & valid
    agreement = float(same.sum() / max(1, valid.sum()))
    first: list[int | None] = []
    worst, breach, cosine = 0.0, False, 1.0
    for r in range(ref_t.shape[0]):
        diff = np.flatnonzero(~same[r] & valid[r])
        produced = int(valid[r].sum())
        first.append(int(diff[0]) if diff.size else None)
        steps = int(diff[0]) + 1 if diff.size and not forced else produced  # a diverging step's logits: agreeing context
        ref_l, got_l = reference.logits[r, :steps], got.logits[r, :steps]
        if not np.isfinite(got_l).all():
            return GenerationResult(hop, precision, ref_t.shape[1], ref_t.shape[0], agreement, float("inf"), first, "",
                                    False, f"NaN/Inf in the logits of prompt {r}")
        err = np.abs(got_l - ref_l)
        worst = max(worst, float(err.max()) if err.size else 0.0)
        if ref_l.size:
            cosine = min(cosine, float(step_cosine(ref_l, got_l).min()))
        scale = max(1.0, float(np.abs(ref_l).max()) if ref_l.size else 1.0)
        breach |= bool((err > atol * scale + rtol * np.abs(ref_l)).any())
    if budget is None:
        budget_text = f"identical tokens, |d|<={atol:g}*scale+{rtol:g}|r|"
        ok = agreement == 1.0 and not breach
        reason = None if ok else (f"tokens differ (agreement {agreement:.4f}, first divergence per prompt {first})"
                                  if agreement < 1.0 else f"logits differ by up to {worst:.3g} (tolerance {budget_text})")
    else:
        budget_text = budget.describe()
        ok = (agreement >= budget.min_tokens and (budget.max_abs is None or worst <= budget.max_abs)
              and (budget.min_cosine is None or cosine >= budget.min_cosine))
        reason = None if ok else (f"token agreement {agreement:.4f}, worst logit error {worst:.3g}, least logit cosine "
                                  f"{cosine:.4f}; budget {budget_text}")
    return GenerationResult(hop, precision, int(ref_t.shape[1]), int(ref_t.shape[0]), agreement, worst, first, budget_text, ok,
                            reason, details={"cosine_min": round(cosine, 6)})


def step_cosine(ref: np.ndarray, got: np.ndarray) -> np.ndarray:
    """The cosine similarity of each step's logit vector [..., vocab] with the reference's (1 where both are zero)."""
    ref, got = np.asarray(ref, dtype=np.float64), np.asarray(got, dtype=np.float64)
    num = (ref * got).sum(-1)
    den = np.linalg.norm(ref, axis=-1) * np.linalg.norm(got, axis=-1)
    both_zero = (np.abs(ref).sum(-1) + np.abs(got).sum(-1)) == 0
    return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.where(both_zero, 1.0, 0.0))


def judge_onnx(model_path: str | Path | None, reference: Generation, prompts: list[list[int]], new_tokens: int, pad: int, *,
               hop: str, precision: str = "fp32", budget: GenerationBudget | None = None, atol: float = 1e-4,
               rtol: float = 1e-3, session=None) -> tuple[GenerationResult, Generation]:
    """The generation check of one KV-cache model in onnxruntime: (its result, the free-running generation).

    FP32: free-running greedy decoding against the reference (identical tokens and logits within
    tolerance, or `budget`). Quantised: top-1 agreement and logit error step by step on the
    reference's context (teacher forcing) judged against `budget`, plus how far free-running
    decoding follows the reference (`free_running_agreement`, `first_divergence_free_running`)."""
    if session is None:
        session = onnx_session(model_path)
    ours = generate_onnx(model_path, prompts, new_tokens, pad, session=session)
    if precision == "fp32":
        return compare_generation(reference, ours, hop=hop, precision=precision, budget=budget, atol=atol, rtol=rtol), ours
    forced = generate_onnx(model_path, prompts, new_tokens, pad, session=session, forced=reference.tokens)
    result = compare_generation(reference, forced, hop=hop, precision=precision, budget=budget, forced=True)
    free = compare_generation(reference, ours, hop=hop, precision=precision, budget=GenerationBudget(0.0))
    result.details.update(free_running_agreement=round(free.tokens, 6), first_divergence_free_running=free.first_divergence)
    return result, ours
