"""One decode step of a transformers decoder whose cache travels as flat tensors: the module
`torch.onnx.export` traces (parsers/hf_decoder.py), the feeds of the left-padded step an export is
checked on, and the transformers outputs on them (the IR's reference), computed here or, with a
greedy generation, in a child process.
"""

from __future__ import annotations

from pathlib import Path

from modelport.deps import require
from modelport.ir import Reference
from modelport.parsers.hf_decoder_config import DecoderConfig, read_decoder_config
from modelport.parsers.hf_decoder_loading import load_model, load_model_per_tensor
from modelport.runtimes.isolated import CONVERT_TIMEOUT_S, call_in_child, read_arrays, timeout_for, write_arrays
from modelport.validation.generation import Generation, generate_transformers

SAMPLE_PAST = 3  # the reference step: a decode with a cache of this length (left-padded batch of 2)
SAMPLE_SEQUENCE = 2


def flat_cache_module(model, cfg: DecoderConfig):
    """An nn.Module `(input_ids, attention_mask, position_ids, *past) -> (logits, *present)` around
    a transformers decoder: the cache travels as flat tensors, which is what ONNX can carry."""
    torch = require("torch")
    from transformers import DynamicCache

    class FlatCacheDecoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, position_ids, *past):
            # no config: plain full-length layers (the masks still follow the model's own attention rules)
            cache = DynamicCache()
            for i in range(cfg.num_layers):
                cache.update(past[2 * i], past[2 * i + 1], i)
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                             past_key_values=cache, use_cache=True)
            present = []
            for layer in out.past_key_values.layers:
                present += [layer.keys, layer.values]
            return (out.logits, *present)

    return FlatCacheDecoder().eval()


def sample_step(cfg: DecoderConfig, *, seed: int = 0, batch: int = 2, past: int = SAMPLE_PAST,
                sequence: int = SAMPLE_SEQUENCE) -> dict:
    """Feeds for one decode step over a left-padded batch: row 0 has two padded slots in its past."""
    import numpy as np

    rng = np.random.default_rng(seed)
    total = past + sequence
    mask = np.ones((batch, total), dtype=np.int64)
    if total > 2:
        mask[0, :min(2, past)] = 0
    positions = np.clip(np.cumsum(mask, axis=1) - 1, 0, None)
    feeds = {
        "input_ids": rng.integers(0, cfg.vocab_size, (batch, sequence), dtype=np.int64),
        "attention_mask": mask,
        "position_ids": positions[:, past:].astype(np.int64),
    }
    for name in cfg.past_names:
        feeds[name] = rng.standard_normal((batch, cfg.kv_heads, past, cfg.head_dim)).astype(np.float32)
    return feeds


def reference_step(model, cfg: DecoderConfig, seed: int) -> Reference:
    """The transformers `model`'s outputs on the left-padded decode step of `sample_step(cfg, seed=seed)`."""
    import numpy as np
    torch = require("torch")

    feeds = sample_step(cfg, seed=seed)
    module = flat_cache_module(model, cfg)
    with torch.no_grad():
        outs = module(*[torch.from_numpy(feeds[n]) for n in cfg.input_names])
    reference = {n: o.detach().numpy().astype(np.float32) for n, o in zip(cfg.output_names, outs, strict=True)}
    return Reference(feeds, reference, producer=f"transformers {require('transformers').__version__}")


def transformers_reference(folder: Path, cfg: DecoderConfig, *, seed: int, prompts: list[list[int]], new_tokens: int,
                           per_tensor: bool = False):
    """(the decode-step Reference, the greedy Generation) of the folder's transformers model, computed
    in a child process: the fp32 model lives and dies there, so none of its memory stays with the
    caller (freed tensors of that size are not all given back to the system by the allocator).
    `per_tensor`: loaded by `load_model_per_tensor` (a checkpoint the decoder writer checked)."""

    def collect(work: Path, response: dict):
        step, gen = read_arrays(work, "step"), read_arrays(work, "generation")
        feeds = {n: step.pop(f"in:{n}") for n in cfg.input_names}
        outputs = {n: step.pop(f"out:{n}") for n in cfg.output_names}
        return (Reference(feeds, outputs, producer=response["producer"]),
                Generation(tokens=gen["tokens"], logits=gen["logits"], producer=response["producer"]))

    return call_in_child("modelport.parsers.hf_decoder_step:_reference_child",
                         {"folder": str(folder), "seed": seed, "prompts": prompts, "new_tokens": new_tokens,
                          "per_tensor": per_tensor},
                         path=folder, timeout=timeout_for(CONVERT_TIMEOUT_S), what="the transformers reference",
                         collect=collect)


def _reference_child(work: Path, request: dict) -> dict:
    """The child's side of `transformers_reference`."""

    folder = Path(request["folder"])
    cfg = read_decoder_config(folder)
    model = load_model_per_tensor(folder) if request.get("per_tensor") else load_model(folder)
    ref = reference_step(model, cfg, int(request["seed"]))
    gen = generate_transformers(model, [list(p) for p in request["prompts"]], int(request["new_tokens"]), cfg.safe_pad)
    write_arrays(work, "step", {**{f"in:{n}": v for n, v in ref.inputs.items()},
                                **{f"out:{n}": v for n, v in ref.outputs.items()}})
    write_arrays(work, "generation", {"tokens": gen.tokens, "logits": gen.logits})
    return {"producer": ref.producer}
