"""Decoder-only language models from a Hugging Face folder, exported with a KV cache.

A `save_pretrained` folder (config.json + safetensors) of a family with rotary embeddings,
grouped-query attention, RMSNorm and a gated MLP (Llama, Mistral, Qwen2, Qwen3, Phi-3, Gemma, Gemma2) becomes
one ONNX model that serves both prefill (an empty past) and decode (one new token):

    inputs   input_ids [batch, sequence] int64, attention_mask [batch, total_sequence] int64,
             position_ids [batch, sequence] int64,
             past_key_values.{i}.key / .value [batch, kv_heads, past_sequence, head_dim]
    outputs  logits [batch, sequence, vocab],
             present.{i}.key / .value [batch, kv_heads, total_sequence, head_dim]

These are the names onnxruntime-genai's decoder expects (`past_key_values.%d.key`,
`present.%d.key`), so the same file serves our own generation loop and an ort-genai folder.

How: `torch.onnx.export(dynamo=True)` of a wrapper module that takes the cache as flat tensors,
builds a `transformers` DynamicCache from them, runs the model and returns the grown cache flat.
The folder is loaded with `local_files_only=True` and `use_safetensors=True` under
`HF_HUB_OFFLINE=1`: nothing is fetched and no pickle is read. A family outside the table is
refused (exit 2) before anything is loaded.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path

from modelport.deps import require
from modelport.errors import BadInputError, UnsupportedError
from modelport.ir import IRModel, Reference, specs_from_onnx

NAME = "hf-decoder"
DESCRIPTION = "Hugging Face decoder-only LM folder (config.json + safetensors), exported with a KV cache"
TASK = "text-generation"

# `architectures[0]` -> the family name onnxruntime-genai knows it by
FAMILIES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Phi3ForCausalLM": "phi3",
    "GemmaForCausalLM": "gemma",
    "Gemma2ForCausalLM": "gemma2",
    "Qwen3ForCausalLM": "qwen3",
}
# attention kinds the export reproduces exactly: a sliding window is applied by the model's own
# attention mask over the full cache, so the exported graph carries it (a window shorter than the
# sequence is honoured, as transformers' sliding-window cache does)
LAYER_TYPES = ("full_attention", "sliding_attention")
SAMPLE_PAST = 3  # the reference step: a decode with a cache of this length (left-padded batch of 2)
SAMPLE_SEQUENCE = 2

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DecoderConfig:
    """What the export, the generation loop and an ort-genai folder need to know of a decoder."""

    architecture: str
    family: str
    num_layers: int
    num_heads: int
    kv_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int
    tied_embeddings: bool
    context_length: int
    bos_token_id: int | None
    eos_token_id: int | list[int] | None
    pad_token_id: int | None
    context_capped_from: int | None = None  # max_position_embeddings when context_length is cut short (see check_rope)

    def to_dict(self) -> dict:
        return dict(self.__dict__)

    @property
    def past_names(self) -> list[str]:
        return [f"past_key_values.{i}.{kv}" for i in range(self.num_layers) for kv in ("key", "value")]

    @property
    def present_names(self) -> list[str]:
        return [f"present.{i}.{kv}" for i in range(self.num_layers) for kv in ("key", "value")]

    @property
    def input_names(self) -> list[str]:
        return ["input_ids", "attention_mask", "position_ids", *self.past_names]

    @property
    def output_names(self) -> list[str]:
        return ["logits", *self.present_names]

    @property
    def safe_pad(self) -> int:
        """A token id for padded slots (masked out, so any id in range will do)."""
        pad = self.pad_token_id
        return pad if isinstance(pad, int) and 0 <= pad < self.vocab_size else 0


def _read_config(folder: Path) -> dict | None:
    try:
        return json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None


def sniff(path: Path) -> bool:
    """A folder whose config.json names a `...ForCausalLM` architecture (cheap: one small JSON read)."""
    if not path.is_dir():
        return False
    cfg = _read_config(path)
    archs = (cfg or {}).get("architectures") or []
    return bool(archs) and isinstance(archs[0], str) and archs[0].endswith("ForCausalLM")


def _first(*values):
    return next((v for v in values if v is not None), None)


def read_decoder_config(folder: str | Path) -> DecoderConfig:
    """The decoder's shape from config.json; an unsupported family or a folder without
    safetensors weights is a BadInputError (exit 2) naming the reason."""
    folder = Path(folder)
    if not folder.is_dir():
        raise BadInputError("not a folder (a Hugging Face text-generation source is a save_pretrained folder)", path=folder)
    cfg = _read_config(folder)
    if cfg is None:
        raise BadInputError("no readable config.json in the folder", path=folder)
    archs = cfg.get("architectures") or []
    arch = archs[0] if archs and isinstance(archs[0], str) else None
    if arch not in FAMILIES:
        raise UnsupportedError(f"architecture {arch or cfg.get('model_type')!r} is not a supported text-generation family; "
                               f"supported: {', '.join(FAMILIES)}", path=folder)
    if not any(folder.glob("*.safetensors")):
        raise BadInputError("no .safetensors weights in the folder (pickled .bin weights are not loaded)", path=folder)
    text = cfg.get("text_config") or cfg
    heads = int(text["num_attention_heads"])
    hidden = int(text["hidden_size"])
    layer_types = text.get("layer_types") or []
    other = sorted({str(t) for t in layer_types} - set(LAYER_TYPES))
    if other:
        raise UnsupportedError(f"{arch} with layer types {other} is not supported; only {' and '.join(LAYER_TYPES)}",
                               path=folder)
    capped = check_rope(text, arch, folder)
    longest = int(_first(text.get("max_position_embeddings"), 2048))
    tied = text.get("tie_word_embeddings")
    if tied is None:
        tied = arch.startswith("Gemma")  # the Gemma configs tie them by default, the others do not
    return DecoderConfig(
        architecture=arch, family=FAMILIES[arch], num_layers=int(text["num_hidden_layers"]), num_heads=heads,
        kv_heads=int(_first(text.get("num_key_value_heads"), heads)),
        head_dim=int(_first(text.get("head_dim"), hidden // heads)), hidden_size=hidden,
        vocab_size=int(text["vocab_size"]), tied_embeddings=bool(tied),
        context_length=capped or longest, context_capped_from=longest if capped else None,
        bos_token_id=text.get("bos_token_id"), eos_token_id=text.get("eos_token_id"), pad_token_id=text.get("pad_token_id"),
    )


def check_rope(text: dict, arch: str, folder: Path) -> int | None:
    """Refuse rotary scalings one KV-cache graph cannot reproduce exactly (exit 2, before loading);
    returns the context length a scaling limits the model to, or None.

    `dynamic` (NTK) recomputes the frequencies from the longest position seen so far, a state kept
    across calls. `longrope` switches from the short to the long factors once a position passes
    original_max_position_embeddings (the exported graph follows that switch step by step), but
    Phi-3's generate then recomputes the whole cache with the long factors
    (`Phi3ForCausalLM.prepare_inputs_for_generation`); a graph fed its own cache keeps the keys it
    rotated with the short ones, so it generates differently past that point. Up to that point it
    is exact, so such a model (Phi-3.5-mini, Phi-4-mini: 4096 of 131072) is converted with its
    context limited to original_max_position_embeddings (the ort-genai folder stops there; the
    caller warns). Without the switch (original at least max_position_embeddings) nothing is cut."""
    rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
    kind = rope.get("rope_type") or rope.get("type") or "default"
    if kind not in ("default", "linear", "llama3", "longrope"):
        why = " (its frequencies follow the longest sequence seen so far, a state one graph cannot keep)" if kind == "dynamic" else ""
        raise UnsupportedError(f"{arch} with rope type {kind!r} is not supported{why}; supported: default, linear, llama3, "
                               "longrope", path=folder)
    if kind == "longrope" and arch == "Phi3ForCausalLM":
        original = _first(rope.get("original_max_position_embeddings"), text.get("original_max_position_embeddings"))
        longest = text.get("max_position_embeddings")
        if original is not None and longest is not None and int(original) < int(longest):
            return int(original)
    return None


def load_model(folder: str | Path):
    """The folder's model in fp32, eval mode, loaded offline from safetensors only."""
    folder = Path(folder)
    read_decoder_config(folder)  # refuses an unsupported family before transformers loads anything
    torch = require("torch", purpose="Hugging Face text-generation sources")
    transformers = require("transformers", purpose="Hugging Face text-generation sources")
    # torch.utils._pytree: torchao, which transformers imports when it is installed, warns there
    # through a handler bound to the real stderr
    for name in ("transformers", "transformers.modeling_utils", "huggingface_hub", "torch.utils._pytree"):
        logging.getLogger(name).setLevel(logging.ERROR)
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    from modelport.parsers.huggingface import offline, weights_problem

    with offline(), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            model, info = transformers.AutoModelForCausalLM.from_pretrained(
                str(folder), local_files_only=True, use_safetensors=True, dtype=torch.float32, output_loading_info=True,
                ignore_mismatched_sizes=True)
        except Exception as e:
            raise BadInputError(f"transformers cannot load the folder: {str(e).splitlines()[0] if str(e) else type(e).__name__}",
                                path=folder) from None
    problem = weights_problem(info)
    if problem:
        raise BadInputError(f"the weights do not fit config.json: {problem}", path=folder)
    return model.eval()


def load_model_per_tensor(folder: str | Path):
    """`load_model` for the checkpoints the decoder writer takes (parsers/hf_decoder_graph.py checked
    their tensors against config.json): the model is built without weights from config.json, given
    fp32 storage, and each parameter is copied from its safetensors file, opened for that tensor
    alone. `from_pretrained` maps the whole checkpoint while it converts it, so its pages are resident
    beside the fp32 model (a bf16 0.5 B folder: 3.3 GB at its peak, 2.4 GB once loaded); here the peak
    is the fp32 model and one tensor. The rotary buffers, computed from config.json at construction,
    are computed again on the CPU (they are not in the checkpoint); a tensor the checkpoint lacks
    (other than a tied output projection) or one of another shape is a BadInputError."""
    folder = Path(folder)
    read_decoder_config(folder)
    torch = require("torch", purpose="Hugging Face text-generation sources")
    transformers = require("transformers", purpose="Hugging Face text-generation sources")
    from safetensors import safe_open

    from modelport.parsers.huggingface import offline, weight_files

    transformers.logging.set_verbosity_error()
    with offline(), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        config = transformers.AutoConfig.from_pretrained(str(folder), local_files_only=True)
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model = model.to_empty(device="cpu")
    where = {}
    for f in weight_files(folder)[0]:
        with safe_open(str(f), framework="pt") as handle:
            where.update(dict.fromkeys(handle.keys(), f))
    tied = getattr(model, "_tied_weights_keys", None) or {}
    tied = tied if isinstance(tied, dict) else {}
    state = model.state_dict(keep_vars=True)
    tie = config.get_text_config().tie_word_embeddings
    with torch.no_grad():
        for name, param in state.items():
            if tie and name in tied:  # tie_weights below points it at its source (its own storage never touched)
                continue
            if name not in where:
                raise BadInputError(f"the weights do not fit config.json: no {name} in the weights", path=folder)
            source = name
            with safe_open(str(where[source]), framework="pt") as handle:  # mapped for this tensor alone
                value = handle.get_tensor(source)
                if list(value.shape) != list(param.shape):
                    raise BadInputError(f"the weights do not fit config.json: {source} is {list(value.shape)} in the "
                                        f"weights but {list(param.shape)} by the config", path=folder)
                param.copy_(value)
                del value
        model.tie_weights()
        for module in model.modules():  # non-persistent buffers: the rotary tables' frequencies
            persistent = set(module.state_dict().keys())
            missing = [n for n, _ in module.named_buffers(recurse=False) if n not in persistent]
            if missing:
                fresh = type(module)(config=module.config)
                for n in missing:
                    getattr(module, n).copy_(getattr(fresh, n))
    return model.eval()


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


def export_decoder(folder: str | Path, *, opset: int | None = None, model=None, cfg: DecoderConfig | None = None,
                   save_to: Path | None = None):
    """(onnx.ModelProto, DecoderConfig): the folder's decoder with a KV cache, dims named batch,
    sequence, past_sequence and total_sequence.

    `save_to` (a path `.../model.onnx`): the exporter writes the model there, its weights tensor by
    tensor into `model.onnx.data` beside it, straight from the torch tensors, and the ModelProto
    returned holds the graph only (its initializers refer to that file). The weights are then never
    held twice in memory (as torch tensors and as protobuf bytes)."""
    folder = Path(folder)
    cfg = cfg or read_decoder_config(folder)
    model = model if model is not None else load_model(folder)
    torch = require("torch")
    module = flat_cache_module(model, cfg)
    feeds = sample_step(cfg)
    args = [torch.from_numpy(feeds[n]) for n in cfg.input_names]
    dim = torch.export.Dim
    batch, seq, past, total = dim("batch"), dim("sequence"), dim("past_sequence"), dim("total_sequence")
    shapes = ({0: batch, 1: seq}, {0: batch, 1: total}, {0: batch, 1: seq}, tuple({0: batch, 2: past} for _ in cfg.past_names))
    for name in ("torch.onnx", "torch.export", "torch._dynamo", "torch.fx"):
        logging.getLogger(name).setLevel(logging.ERROR)
    from modelport.progress import doing

    captured = io.StringIO()
    import warnings

    with doing("torch.onnx.export, dynamo"), contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            prog = torch.onnx.export(module, tuple(args), dynamo=True, input_names=cfg.input_names,
                                     output_names=cfg.output_names, dynamic_shapes=shapes, opset_version=opset,
                                     external_data=False, optimize=True)
        except Exception as e:
            raise UnsupportedError(f"{cfg.architecture} cannot be exported with a KV cache: {export_failure(e)}",
                                   path=folder) from None
    from modelport.optimize.weight_store import forget_onnxscript_matches

    forget_onnxscript_matches()  # else a rewrite rule keeps the export's graph, and the torch parameters in it
    if save_to is None:
        onnx_model = prog.model_proto
        name_dims(onnx_model, cfg)
        return onnx_model, cfg
    import onnx

    with doing(f"writing the export's weights to {save_to.name}.data"):
        prog.save(str(save_to), external_data=True)
    del prog
    onnx_model = onnx.load(str(save_to), load_external_data=False)
    name_dims(onnx_model, cfg)
    onnx.save_model(onnx_model, str(save_to))  # the graph with its dims named; the data file stays as written
    return onnx_model, cfg


ANSI = re.compile(r"\x1b\[[0-9;]*m")


def export_failure(error: BaseException) -> str:
    """One line for a failed torch.onnx.export: the first line of the error that started it (the
    exporter's own first line only says which of its steps failed), and the source line that
    raised it when the exporter names one."""
    root = error
    while root.__cause__ is not None and root.__cause__ is not root:
        root = root.__cause__
    lines = [ln.strip() for ln in ANSI.sub("", str(root)).splitlines() if ln.strip()]
    text = lines[0] if lines else type(root).__name__
    where = re.search(r'File "([^"]+)", line (\d+), in (\w+)', ANSI.sub("", f"{error}\n{root}"))
    if where:
        text += f" (at {'/'.join(Path(where[1]).parts[-2:])}:{where[2]}, in {where[3]})"
    return text


def name_dims(model, cfg: DecoderConfig) -> None:
    """The exporter names derived dims by their formula ('past_sequence + sequence'): call them
    total_sequence on the graph's outputs, as the attention mask does."""
    present = set(cfg.present_names)
    for out in model.graph.output:
        dims = out.type.tensor_type.shape.dim
        if out.name in present and len(dims) == 4:
            dims[2].dim_param = "total_sequence"
        elif out.name == "logits" and len(dims) == 3:
            dims[0].dim_param, dims[1].dim_param = "batch", "sequence"


def parse(source, spec) -> IRModel:
    """The IR of a decoder folder, with the reference outputs of one left-padded decode step."""
    folder = Path(source)
    cfg = read_decoder_config(folder)
    return parse_loaded(folder, spec, load_model(folder), cfg)


def export_task(task, ctx) -> IRModel:
    """The `text-generation` entry of the Hugging Face parser's task table (parsers/huggingface.py)."""
    return parse(ctx.folder, ctx.spec)


def parse_loaded(folder: Path, spec, model, cfg: DecoderConfig, *, save_to: Path | None = None) -> IRModel:
    """`parse` for a model already loaded (the caller keeps it, e.g. to generate references).
    `save_to`: see `export_decoder` (the IR's model is then the graph, its weights in that file)."""
    onnx_model, cfg = export_decoder(folder, opset=spec.opset, model=model, cfg=cfg, save_to=save_to)
    return ir_of(folder, spec, onnx_model, cfg, model, exporter="torch.onnx dynamo (flat KV cache)")


def ir_of(folder: Path, spec, onnx_model, cfg: DecoderConfig, model, *, exporter: str) -> IRModel:
    """The IR of a decoder graph (exported or written); its reference is the transformers `model`'s
    outputs on one left-padded decode step (none when `model` is None: see `reference_step`)."""
    inputs = specs_from_onnx(onnx_model.graph.input)
    for s in inputs:
        if s.name == "input_ids":
            s.value_range = [0, cfg.vocab_size]
    return IRModel(
        model=onnx_model,
        inputs=inputs,
        outputs=specs_from_onnx(onnx_model.graph.output),
        provenance={
            "framework": "transformers", "format": f"Hugging Face folder ({cfg.architecture})", "path": str(folder),
            "exporter": exporter, "task": TASK, "decoder": cfg.to_dict(),
            "opset": next((o.version for o in onnx_model.opset_import if o.domain in ("", "ai.onnx")), None),
        },
        reference=reference_step(model, cfg, spec.seed) if model is not None else None,
        sample_dims={"batch": 2, "sequence": SAMPLE_SEQUENCE, "past_sequence": SAMPLE_PAST,
                     "total_sequence": SAMPLE_PAST + SAMPLE_SEQUENCE},
    )


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


def decoder_config_of(ir: IRModel) -> DecoderConfig | None:
    d = ir.provenance.get("decoder")
    return DecoderConfig(**d) if isinstance(d, dict) else None


def transformers_reference(folder: Path, cfg: DecoderConfig, *, seed: int, prompts: list[list[int]], new_tokens: int,
                           per_tensor: bool = False):
    """(the decode-step Reference, the greedy Generation) of the folder's transformers model, computed
    in a child process: the fp32 model lives and dies there, so none of its memory stays with the
    caller (freed tensors of that size are not all given back to the system by the allocator).
    `per_tensor`: loaded by `load_model_per_tensor` (a checkpoint the decoder writer checked)."""
    from modelport.runtimes.isolated import CONVERT_TIMEOUT_S, call_in_child, read_arrays, timeout_for
    from modelport.validation.generation import Generation

    def collect(work: Path, response: dict):
        step, gen = read_arrays(work, "step"), read_arrays(work, "generation")
        feeds = {n: step.pop(f"in:{n}") for n in cfg.input_names}
        outputs = {n: step.pop(f"out:{n}") for n in cfg.output_names}
        return (Reference(feeds, outputs, producer=response["producer"]),
                Generation(tokens=gen["tokens"], logits=gen["logits"], producer=response["producer"]))

    return call_in_child("modelport.parsers.hf_decoder:_reference_child",
                         {"folder": str(folder), "seed": seed, "prompts": prompts, "new_tokens": new_tokens,
                          "per_tensor": per_tensor},
                         path=folder, timeout=timeout_for(CONVERT_TIMEOUT_S), what="the transformers reference",
                         collect=collect)


def _reference_child(work: Path, request: dict) -> dict:
    """The child's side of `transformers_reference`."""
    from modelport.runtimes.isolated import write_arrays
    from modelport.validation.generation import generate_transformers

    folder = Path(request["folder"])
    cfg = read_decoder_config(folder)
    model = load_model_per_tensor(folder) if request.get("per_tensor") else load_model(folder)
    ref = reference_step(model, cfg, int(request["seed"]))
    gen = generate_transformers(model, [list(p) for p in request["prompts"]], int(request["new_tokens"]), cfg.safe_pad)
    write_arrays(work, "step", {**{f"in:{n}": v for n, v in ref.inputs.items()},
                                **{f"out:{n}": v for n, v in ref.outputs.items()}})
    write_arrays(work, "generation", {"tokens": gen.tokens, "logits": gen.logits})
    return {"producer": ref.producer}
