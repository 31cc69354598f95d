"""A decoder's reference logits computed a layer at a time from its safetensors, never holding the model.

The generation check (validation/generation.py) takes its reference from `transformers` with the
whole model loaded in fp32: 4 bytes a parameter, 30 GB for a 7B decoder, more than the machine that
quantises it to int4 has. The logits of one teacher-forced pass need far less: the hidden states
of the sequences ([len, hidden] each) go through the decoder one layer at a time, and only that
layer's weights need to be in memory.

`streamed_logits(folder, sequences)` does that pass from a Hugging Face folder (config.json and
model.safetensors, or shards listed by model.safetensors.index.json):

1. the embedding tensor alone is read, the sequences embedded, and the tensor dropped;
2. for each decoder layer: the layer module of the model's own `transformers` class is taken from
   a skeleton built on the meta device (no memory), only that layer's tensors are read
   (`safetensors.safe_open`) and assigned to it, every sequence's hidden states go through it with
   the rotary cos/sin (the model's rotary module, built on the CPU from the config, so its
   `inv_freq` is computed, not left on meta) and the mask the model itself would build
   (`masking_utils.create_causal_mask`: with sdpa and no padding it is None and sdpa runs with
   `is_causal` for len > 1; a sliding-window layer gets its windowed mask), then the layer is freed;
3. the final norm and the LM head (`lm_head.weight`, or the embedding when `tie_word_embeddings`).

Peak memory: one layer (about 0.9 GB in fp32 for a 7B Llama, 1.9 GB for Qwen2-7B's larger MLP),
or the embedding/head matrix (up to 2.2 GB in fp32 for Qwen2's 152k vocabulary), plus activations
([len, vocab] logits a sequence). Each layer is read once for all the sequences.

`logits_agreement(ref, got)` compares two [len, vocab] logit arrays position by position with the
measures that still mean something on random weights, where greedy tokens are near-tied: cosine
(min and mean), top-1 agreement, top-k overlap and the worst absolute error.

`judge_streamed` is the generation check built on it (the text-generation pipeline's `--reference
streamed`, which `--reference auto` takes from 1 B parameters on or when the fp32 model does not fit):
  1. greedy-decode N tokens from each prompt with the artifact itself in onnxruntime (the generation
     loop of validation/generation.py, the left-padded batch), keeping its logits at every step;
  2. once the artifact's session is dropped, one streamed teacher-forced pass over each prompt +
     those tokens: the reference's logits at the very positions the artifact saw, so no
     divergence point cuts the comparison short;
  3. the two compared step by step (`compare_generation(..., forced=True)`: top-1 agreement, the
     worst logit error, the least cosine), judged against the budget, with `logits_agreement`'s mean
     cosine and top-5 overlap beside them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from modelport.errors import BadInputError, UnsupportedError
from modelport.run import progress as _progress
from modelport.validation.generation import (
    Generation,
    GenerationBudget,
    GenerationResult,
    cache_shapes,
    compare_generation,
    generate_onnx,
    onnx_session,
    step_cosine,
)

MEASURE = ("teacher-forced on the artifact's own greedy tokens: top-1 agreement, worst logit error and least cosine per step "
           "against fp32 logits streamed a layer at a time from the safetensors")

# decoders whose layer is a self-contained module called as layer(hidden, attention_mask=,
# position_ids=, position_embeddings=(cos, sin)) with plain embeddings (no scaling) and a plain
# LM head (no soft-capping): what a teacher-forced pass reproduces exactly
SUPPORTED = ("LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM", "Qwen3ForCausalLM")
DTYPES = ("float32", "bfloat16")


def weight_map(folder: Path) -> dict[str, str]:
    """tensor name -> the safetensors file (name inside `folder`) that holds it."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            return dict(json.loads(index.read_text())["weight_map"])
        except (ValueError, KeyError, TypeError) as e:
            raise BadInputError(f"{index} is not a safetensors index (no weight_map): {e}", path=str(index)) from e
    single = folder / "model.safetensors"
    if single.is_file():
        from safetensors import safe_open

        with safe_open(str(single), framework="pt", device="cpu") as f:
            return {name: single.name for name in f.keys()}
    raise BadInputError(f"{folder} has neither model.safetensors nor model.safetensors.index.json",
                        path=str(folder), hint="the streamed reference reads safetensors weights only")


def read_tensors(folder: Path, wmap: dict[str, str], names: list[str], dtype) -> dict:
    """Only `names`, each read once from its shard and cast to `dtype` (torch tensors)."""
    import safetensors

    missing = [n for n in names if n not in wmap]
    if missing:
        raise BadInputError(f"{folder}: the weights lack {', '.join(missing[:5])}", path=str(folder))
    by_file: dict[str, list[str]] = {}
    for n in names:
        by_file.setdefault(wmap[n], []).append(n)
    out = {}
    for file, group in by_file.items():
        with safetensors.safe_open(str(folder / file), framework="pt", device="cpu") as f:
            for n in group:
                out[n] = f.get_tensor(n).to(dtype)
    return out


def _config(folder: Path):
    from transformers import AutoConfig

    if not (folder / "config.json").is_file():
        raise BadInputError(f"{folder} has no config.json", path=str(folder))
    config = AutoConfig.from_pretrained(str(folder))
    arch = (getattr(config, "architectures", None) or [None])[0]
    if arch is None:  # no `architectures`: the causal LM of its model_type
        arch = {a.removesuffix("ForCausalLM").lower(): a for a in SUPPORTED}.get(config.model_type)
    if arch not in SUPPORTED:
        named = arch or f"of model_type {config.model_type!r} (config.json names no architectures)"
        raise UnsupportedError(f"the streamed reference does not support the architecture {named}",
                               path=str(folder), hint=f"supported: {', '.join(SUPPORTED)}")
    return config


def _skeleton(config):
    """The whole model on the meta device: module classes, names and the attention setting, no memory."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def _load(module, prefix: str, folder: Path, wmap: dict[str, str], dtype) -> None:
    """Give a meta `module` its weights: the tensors named `prefix` + its state-dict keys, assigned."""
    keys = list(module.state_dict().keys())
    tensors = read_tensors(folder, wmap, [prefix + k for k in keys], dtype)
    module.load_state_dict({k: tensors[prefix + k] for k in keys}, strict=True, assign=True)
    left = [n for n, t in [*module.named_parameters(), *module.named_buffers()] if t.is_meta]
    if left:
        raise UnsupportedError(f"{prefix or 'the module'}: {', '.join(left)} not in the weights (a buffer computed at init?)")


def _masks(config, layer_types: set[str], hidden, position_ids) -> dict:
    """The attention mask the model builds for each layer type (None: sdpa's is_causal)."""
    from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

    kwargs = dict(config=config, inputs_embeds=hidden, attention_mask=None, cache=None, position_ids=position_ids)
    masks = {"full_attention": create_causal_mask(**kwargs)}
    if "sliding_attention" in layer_types:
        masks["sliding_attention"] = create_sliding_window_causal_mask(**kwargs)
    return masks


def streamed_logits(folder: Path, sequences: list[list[int]], *, dtype: str = "float32",
                    progress: Callable[[int, int], None] | None = None) -> list[np.ndarray]:
    """Teacher-forced logits [len, vocab] (float32) of each token sequence, a layer at a time.

    Each sequence runs as its own batch of 1 (no padding), all of them through a layer before the
    next layer is read. Weights (and activations) are cast to `dtype` ("float32" or "bfloat16").
    `progress(i, n)` is called once layer i (from 0) of n has run and been freed.
    """
    import torch
    import torch.nn.functional as F

    folder = Path(folder)
    if dtype not in DTYPES:
        raise BadInputError(f"dtype {dtype!r}: the streamed reference computes in {' or '.join(DTYPES)}")
    torch_dtype = getattr(torch, dtype)
    config = _config(folder)
    seqs = [list(map(int, s)) for s in sequences]
    if not seqs:
        return []
    vocab = config.vocab_size
    for s in seqs:
        if not s:
            raise BadInputError("the streamed reference needs sequences of at least one token")
        if min(s) < 0 or max(s) >= vocab:
            raise BadInputError(f"token ids must lie in [0, {vocab}): got {min(s)}..{max(s)}")
    wmap = weight_map(folder)
    skeleton = _skeleton(config)
    mconfig = skeleton.config  # with the attention implementation from_config settled on
    base_prefix = skeleton.base_model_prefix
    base = getattr(skeleton, base_prefix)
    layers = base.layers
    n = len(layers)
    # per-layer attention kind as the model's forward picks its mask: Qwen2/Qwen3 list them in
    # `layer_types`; Mistral has none and windows every layer when `sliding_window` is set
    default_type = "sliding_attention" if getattr(mconfig, "sliding_window", None) is not None else "full_attention"
    layer_types = list(getattr(mconfig, "layer_types", None) or [default_type] * n)
    embed_name = f"{base_prefix}.embed_tokens.weight"

    with torch.inference_mode():
        # 1. embeddings: the one tensor, then dropped
        embed = read_tensors(folder, wmap, [embed_name], torch_dtype)[embed_name]
        hidden = [F.embedding(torch.tensor([s]), embed) for s in seqs]
        del embed
        # rotary cos/sin: the model's own rotary class built on the CPU (inv_freq computed)
        rotary = type(base.rotary_emb)(config=mconfig)
        positions = [torch.arange(len(s)).unsqueeze(0) for s in seqs]
        rope = [rotary(h, p) for h, p in zip(hidden, positions, strict=True)]
        masks = [_masks(mconfig, set(layer_types), h, p) for h, p in zip(hidden, positions, strict=True)]

        # 2. one decoder layer at a time
        for i in range(n):
            layer = layers[i]
            layers[i] = torch.nn.Identity()  # the skeleton holds no reference to the loaded layer
            _load(layer, f"{base_prefix}.layers.{i}.", folder, wmap, torch_dtype)
            layer.eval()
            for j, h in enumerate(hidden):
                out = layer(h, attention_mask=masks[j][layer_types[i]], position_ids=positions[j],
                            position_embeddings=rope[j], use_cache=False)
                hidden[j] = out[0] if isinstance(out, tuple) else out
            del layer
            _progress.tick("streaming", f"layer {i}", i, n)
            if progress is not None:
                progress(i, n)

        # 3. final norm, then the LM head (the embedding when tied)
        norm = base.norm
        _load(norm, f"{base_prefix}.norm.", folder, wmap, torch_dtype)
        head_name = embed_name if getattr(mconfig, "tie_word_embeddings", False) else "lm_head.weight"
        head = read_tensors(folder, wmap, [head_name], torch_dtype)[head_name]
        logits = [F.linear(norm(h), head)[0].float().numpy() for h in hidden]
        del head
    return logits


def logits_agreement(ref: np.ndarray, got: np.ndarray, k: int = 5) -> dict:
    """How closely `got` follows `ref`, both [positions, vocab] (a leading batch of 1 is dropped).

    cosine_min / cosine_mean: per-position cosine similarity of the logit vectors;
    top1: fraction of positions whose argmax agrees;
    topk: |topk(ref) ∩ topk(got)| / k, averaged over positions (k capped at the vocabulary);
    max_abs: the worst absolute logit difference; positions: how many were compared.
    """
    ref = np.asarray(ref, dtype=np.float64)
    got = np.asarray(got, dtype=np.float64)
    if ref.ndim == 3 and ref.shape[0] == 1:
        ref = ref[0]
    if got.ndim == 3 and got.shape[0] == 1:
        got = got[0]
    if ref.shape != got.shape or ref.ndim != 2:
        raise BadInputError(f"logits_agreement compares two [positions, vocab] arrays: got {ref.shape} and {got.shape}")
    if ref.shape[0] == 0:
        raise BadInputError("logits_agreement needs at least one position")
    k = max(1, min(int(k), ref.shape[1]))
    cos = step_cosine(ref, got)
    top_ref = np.argsort(-ref, axis=-1, kind="stable")[:, :k]
    top_got = np.argsort(-got, axis=-1, kind="stable")[:, :k]
    overlap = [len(set(a.tolist()) & set(b.tolist())) / k for a, b in zip(top_ref, top_got, strict=True)]
    return {
        "positions": int(ref.shape[0]),
        "cosine_min": float(cos.min()),
        "cosine_mean": float(cos.mean()),
        "top1": float(np.mean(ref.argmax(-1) == got.argmax(-1))),
        "topk": float(np.mean(overlap)),
        "k": k,
        "max_abs": float(np.abs(ref - got).max()),
    }


def sequence_logits(folder: Path, sequences: list[list[int]], *, dtype: str = "float32", cache: dict | None = None) -> list[np.ndarray]:
    """`streamed_logits` of `sequences`, in this process: its peak is one layer (or the embedding)
    in fp32, each freed before the next is read, and it runs while no onnxruntime session is held;
    a child process would pay torch's and transformers' import (5-10 s) at every call. `cache`: a
    dict kept by the caller across calls; the same sequences of the same folder are then streamed
    once (two artifacts of one model file generate the same tokens)."""
    key = (str(folder), dtype, tuple(tuple(int(t) for t in s) for s in sequences))
    if cache is not None and key in cache:
        return cache[key]
    logits = streamed_logits(Path(folder), [list(k) for k in key[2]], dtype=dtype)
    if cache is not None:
        cache.clear()  # one entry: the logits of a 7 B vocabulary are 0.6 MB a position
        cache[key] = logits
    return logits


def reference_generation(folder: Path, prompts: list[list[int]], tokens: np.ndarray, *, dtype: str = "float32",
                         cache: dict | None = None) -> Generation:
    """The streamed reference at an artifact's own context: for each prompt r, the logits the source
    gives at each of the artifact's generated steps (one pass over prompt + tokens[r][:-1]), with
    their argmax as the reference's tokens [batch, steps]."""
    tokens = np.asarray(tokens, dtype=np.int64)
    sequences = [list(p) + [int(t) for t in tokens[r, :-1]] for r, p in enumerate(prompts)]
    got = sequence_logits(folder, sequences, dtype=dtype, cache=cache)
    steps = tokens.shape[1]
    logits = np.stack([got[r][len(p) - 1:len(p) - 1 + steps] for r, p in enumerate(prompts)])
    return Generation(tokens=logits.argmax(-1).astype(np.int64), logits=logits, producer=f"streamed ({dtype})")


def judge_streamed(model_path: Path, folder: Path, prompts: list[list[int]], new_tokens: int, pad: int, *, hop: str,
                   precision: str = "fp32", budget: GenerationBudget | None = None, atol: float = 1e-4, rtol: float = 1e-3,
                   session=None, cache: dict | None = None) -> tuple[GenerationResult, Generation]:
    """The generation check of one KV-cache model against the streamed reference: (its result, its
    own greedy generation). The artifact decodes greedily in onnxruntime; the reference's logits are
    then computed at the artifact's context (`reference_generation`, after the session is dropped,
    so the two never hold memory together: pass no `session` the caller keeps) and compared step by
    step. FP32 without a budget: identical top-1 at every step and logits within the scaled
    tolerance; else the budget."""
    if session is None:
        session = onnx_session(model_path)
    ours = generate_onnx(model_path, prompts, new_tokens, pad, session=session)
    del session
    reference = reference_generation(folder, prompts, ours.tokens, cache=cache)
    result = compare_generation(reference, ours, hop=hop, precision=precision, budget=budget, atol=atol, rtol=rtol, forced=True)
    rows = [logits_agreement(reference.logits[r], ours.logits[r]) for r in range(len(prompts))]
    positions = sum(r["positions"] for r in rows)
    result.details.update(reference="streamed", measure=MEASURE,
                          cosine_mean=round(sum(r["cosine_mean"] * r["positions"] for r in rows) / positions, 6),
                          top5=round(sum(r["topk"] * r["positions"] for r in rows) / positions, 6))
    return result, ours


def judge_prefill(model_path: Path, folder: Path, prompts: list[list[int]], *, hop: str, atol: float = 1e-4,
                  rtol: float = 1e-3, cache: dict | None = None) -> GenerationResult:
    """An fp32 KV-cache graph against the streamed reference on a prefill of each prompt (a batch of
    one, an empty cache): identical top-1 and logits within the scaled tolerance at every position.
    `details["positions"]`: how many positions were compared."""
    session = onnx_session(model_path)
    _, _, shapes, dtype = cache_shapes(session)
    takes = {i.name for i in session.get_inputs()}
    got = []
    for p in prompts:
        ids = np.array([p], dtype=np.int64)
        feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids), "position_ids": np.arange(len(p), dtype=np.int64)[None],
                 **{n: np.zeros((1, h, 0, d), dtype=dtype) for n, (h, d) in shapes.items()}}
        got.append(session.run(["logits"], {k: v for k, v in feeds.items() if k in takes})[0][0].astype(np.float32))
    del session
    ref = sequence_logits(folder, [list(p) for p in prompts], cache=cache)
    ref_logits = np.concatenate(ref)[None]
    got_logits = np.concatenate(got)[None]
    result = compare_generation(Generation(ref_logits.argmax(-1), ref_logits), Generation(got_logits.argmax(-1), got_logits),
                                hop=hop, atol=atol, rtol=rtol, forced=True)
    result.details.update(positions=int(ref_logits.shape[1]), reference="streamed")
    return result
