"""Hugging Face model folders: `config.json` + `*.safetensors`, as transformers' `save_pretrained` writes them.

The task (`--task`, else inferred from the config's `architectures`) picks the transformers class
that loads the weights, the inputs built from the config (token ids, masks and type ids;
`pixel_values` at the configured image size; `input_values` or Whisper-style `input_features` for
speech: parsers/hf_inputs.py), their named dynamic dims, and the output names. `TASKS`
(parsers/hf_tasks.py) holds one entry per task; a task exported as several models (text2text and
speech recognition: an encoder and a decoder) names its own export function, and so does
`text-generation` (a decoder-only LLM with its KV cache: parsers/hf_decoder.py; `convert` takes
such folders through orchestration/text_generation.py, which validates them by greedy generation).

Every model goes through the PyTorch parser (`parsers.pytorch.parse` on a module that takes the
inputs positionally and returns the task's outputs): references from transformers in eager mode,
the torch.onnx exporter with its fallbacks. A task exported as several models gives an IR whose
`parts` are one full IR each, converted and validated one by one into `OUT/<part>/`.

Safety (parsers/hf_folder.py): weights load from safetensors only (`use_safetensors=True`, each
file's header checked first); a folder holding only pickled weights (`pytorch_model.bin`) or a
config that asks for code from the folder (`auto_map`, i.e. `trust_remote_code`) is refused
(exit 3) unless `trust` is set. Loading (parsers/hf_loading.py) never reaches the network
(`local_files_only=True`, `HF_HUB_OFFLINE=1`) and never writes into the folder. Weights that do
not cover the model (a tensor missing from the safetensors, or of another shape than config.json
makes) are refused (exit 2, `weights_problem`): transformers would fill them with random values,
and every reference would agree with the random model. Tokenizer and preprocessor files are
listed in the IR's provenance (`companion_files`); the convert stage copies them next to the
artifacts.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect as pyinspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from modelport.errors import BadInputError
from modelport.ir import IRModel, TensorSpec
from modelport.parsers import pytorch
from modelport.parsers.hf_folder import check_safety, companion_files, parameter_count, read_config, weight_files
from modelport.parsers.hf_inputs import SAMPLE_SEQUENCE, apply_user_specs, input_specs
from modelport.parsers.hf_loading import load_model, offline
from modelport.parsers.hf_tasks import TASKS, Task, infer_task, modality_of, task_name, transformers_class
from modelport.resolve.specs import SourceSpec

# orchestration imports check_safety, companion_files, parameter_count, read_config, weight_files and task_name
# from this module, besides the parser's own sniff, parse and inspect

NAME = "huggingface"
DESCRIPTION = "Hugging Face model folder (config.json + *.safetensors from save_pretrained); --task picks what to export"


def sniff(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").is_file()


# --- exporting -----------------------------------------------------------------------------------


@dataclass
class Context:
    """What a task's export function gets: the folder, its config, the user's spec and the loader."""

    folder: Path
    config: dict
    spec: object  # SourceSpec
    load: Callable[[Task], object]  # task -> the loaded nn.Module (eval mode, float32)
    transformers: object


def _module(call: Callable, input_names: list[str], outputs: tuple[str, ...], owner=None):
    """An nn.Module taking the inputs positionally and returning the named outputs as a tuple;
    `owner` is the module whose weights a plain function `call` uses (registered, so the exporter
    sees them as parameters)."""
    torch = importlib.import_module("torch")

    class TaskModule(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = call if isinstance(call, torch.nn.Module) else owner
            self.function = None if isinstance(call, torch.nn.Module) else call

        def forward(self, *args):
            out = (self.function or self.inner)(**dict(zip(input_names, args, strict=True)))
            missing = [n for n in outputs if getattr(out, n, None) is None]
            if missing:
                raise BadInputError(f"the model's output has no {missing}")
            return tuple(getattr(out, n) for n in outputs)

    # torch.export matches dynamic shapes to named parameters: one per input, not a *args tuple
    P = pyinspect.Parameter
    TaskModule.forward.__signature__ = pyinspect.Signature(
        [P("self", P.POSITIONAL_OR_KEYWORD), *(P(n, P.POSITIONAL_OR_KEYWORD) for n in input_names)])
    return TaskModule().eval()


def export_part(module, specs: list[TensorSpec], output_names: list[str], sample_dims: dict[str, int], ctx: Context,
                given: dict | None = None) -> IRModel:
    """One model through the PyTorch parser (eager references, torch.onnx with its fallbacks);
    `given`: the user's pinned sample inputs for this model (default: all of them)."""

    spec = ctx.spec
    sub = SourceSpec(path=ctx.folder, inputs=specs, output_names=list(output_names), trust=spec.trust, opset=spec.opset,
                     sample_dims={**sample_dims, **spec.sample_dims}, seed=spec.seed,
                     given=dict(spec.given) if given is None else given, weights_dir=spec.weights_dir)
    return pytorch.parse(module, sub)


def export_single(task: Task, ctx: Context) -> IRModel:
    """A task that is one forward pass: the model's main inputs in, the task's outputs out."""
    model = ctx.load(task)
    if ctx.config.get("is_encoder_decoder") and task.name == "feature-extraction" and hasattr(model, "get_encoder"):
        model = model.get_encoder()
    modality = modality_of(type(model))
    if task.modalities is not None and modality not in task.modalities:
        raise BadInputError(f"task {task.name} does not fit this {ctx.config['model_type']} model (its input is "
                            f"{getattr(type(model), 'main_input_name', '?')})", path=ctx.folder)
    specs, dims = input_specs(modality, model.config, model, ctx.folder)
    specs = apply_user_specs(specs, ctx.spec.inputs)
    outputs = list(ctx.spec.output_names or task.outputs)
    if len(outputs) != len(task.outputs):
        raise BadInputError(f"{len(outputs)} output names given; task {task.name} has {len(task.outputs)}: {list(task.outputs)}",
                            path=ctx.folder)
    module = _module(model, [s.name for s in specs], task.outputs)
    return export_part(module, specs, outputs, dims, ctx)


def export_seq2seq(task: Task, ctx: Context) -> IRModel:
    """An encoder-decoder as two models, each converted and validated on its own:

    - `encoder`: the encoder's inputs (input_ids, attention_mask; Whisper's input_features) ->
      `last_hidden_state` [batch, sequence, d_model] (a speech encoder's length is fixed: max_source_positions);
    - `decoder`: `decoder_input_ids` [batch, decoder_sequence], `encoder_hidden_states` and, where
      the encoder takes a mask, `encoder_attention_mask` [batch, sequence] -> `logits`
      [batch, decoder_sequence, vocab], one full decoder pass without a KV cache.
    """
    if ctx.spec.output_names:
        raise BadInputError(f"--output does not apply to {task.name}: its two models have fixed output names", path=ctx.folder)
    model = ctx.load(task)
    config = model.config
    encoder = model.get_encoder()
    modality = modality_of(type(model))
    if modality not in task.modalities:
        raise BadInputError(f"task {task.name} does not fit this {config.model_type} model (its input is "
                            f"{getattr(type(model), 'main_input_name', '?')})", path=ctx.folder)
    enc_specs, dims = input_specs(modality, config, encoder, ctx.folder)
    enc_specs = [s for s in enc_specs if s.name != "token_type_ids"]
    width = int(getattr(config, "d_model", 0) or getattr(config, "hidden_size", 0))
    vocab = int(config.vocab_size)
    length = int(config.max_source_positions) if modality == "audio-features" else "sequence"
    dec_specs = [
        TensorSpec("decoder_input_ids", "int64", ["batch", "decoder_sequence"], "NT", value_range=[0, vocab]),
        TensorSpec("encoder_hidden_states", "float32", ["batch", length, width], "NTC"),
    ]
    if any(s.name == "attention_mask" for s in enc_specs):
        dec_specs.append(TensorSpec("encoder_attention_mask", "int64", ["batch", "sequence"], "NT", value_range=[1, 2]))
    known = {s.name for s in enc_specs} | {s.name for s in dec_specs}
    unknown = sorted({s.name for s in ctx.spec.inputs} - known) + sorted(set(ctx.spec.given) - known)
    if unknown:
        raise BadInputError(f"unknown input {unknown}; the encoder takes {[s.name for s in enc_specs]}, "
                            f"the decoder {[s.name for s in dec_specs]}", path=ctx.folder)
    enc_specs = apply_user_specs(enc_specs, [s for s in ctx.spec.inputs if s.name in {e.name for e in enc_specs}])
    dec_specs = apply_user_specs(dec_specs, [s for s in ctx.spec.inputs if s.name in {d.name for d in dec_specs}])

    def decode(decoder_input_ids, encoder_hidden_states, encoder_attention_mask=None):
        return model(decoder_input_ids=decoder_input_ids, encoder_outputs=(encoder_hidden_states,),
                     attention_mask=encoder_attention_mask, use_cache=False)

    def given(specs):
        return {k: v for k, v in ctx.spec.given.items() if k in {s.name for s in specs}}

    parts = {
        "encoder": export_part(_module(encoder, [s.name for s in enc_specs], ("last_hidden_state",)), enc_specs,
                               ["last_hidden_state"], dims, ctx, given(enc_specs)),
        "decoder": export_part(_module(decode, [s.name for s in dec_specs], ("logits",), owner=model), dec_specs, ["logits"],
                               {**dims, "decoder_sequence": max(2, dims.get("sequence", SAMPLE_SEQUENCE) // 2)}, ctx,
                               given(dec_specs)),
    }
    first = parts["encoder"]
    return IRModel(model=None, inputs=[], outputs=[], provenance=dict(first.provenance), parts=parts)


def _function(target: str) -> Callable:
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def parse(source, spec) -> IRModel:
    folder = Path(source)
    if not sniff(folder):
        raise BadInputError("not a Hugging Face model folder: no config.json inside", path=folder)
    config = read_config(folder)
    safetensors = check_safety(folder, config, trust=spec.trust)
    companions = [str(p) for p in companion_files(folder)]  # a link leading outside the folder is refused before any load
    asked = spec.options.get("task")
    with offline() as transformers:
        try:
            inferred = infer_task(config, folder, transformers)
        except BadInputError:
            if not asked:
                raise
            inferred = None
        name = task_name(asked) if asked else inferred
        task = TASKS[name]
        if not task.supported:
            raise BadInputError(f"task {name} is not supported yet ({task.description})", path=folder,
                                hint=f"supported: {', '.join(n for n, t in TASKS.items() if t.supported)}")
        ctx = Context(folder=folder, config=config, spec=spec, transformers=transformers,
                      load=lambda t: load_model(t, folder, config, trust=spec.trust, safetensors=safetensors,
                                                inferred=name == inferred,
                                                transformers=transformers))
        ir = (_function(task.export) if task.export else export_single)(task, ctx)
    arch = (config.get("architectures") or ["?"])[0]
    for part in [ir, *ir.parts.values()]:
        part.provenance.update(framework=NAME, path=str(folder), task=name, architecture=arch,
                               format=f"transformers {config['model_type']} ({'safetensors' if safetensors else 'pickle, --trust'})",
                               companion_files=companions)
    return ir


def _task_io(config: dict, folder: Path, task: Task) -> dict:
    """The inputs and outputs `convert` gives the inferred task, from the config and the class the
    config names (transformers' own; nothing is loaded from the folder but config.json)."""
    with offline() as transformers:
        cls = transformers_class(transformers, (config.get("architectures") or [""])[0], config["model_type"])
        config_class = getattr(cls, "config_class", None)
        if cls is None or config_class is None:
            return {}
        cfg = config_class.from_dict({k: v for k, v in config.items() if k != "auto_map"})
        modality = modality_of(cls)
        if config.get("is_encoder_decoder") and task.name == "feature-extraction" and modality == "text":
            return {}
        specs, _ = input_specs(modality, cfg, cls, folder)
    return {"inputs": [s.to_dict() for s in specs], "outputs": [{"name": n} for n in task.outputs]}


def inspect(path: Path) -> dict:
    """The folder's model type, architecture, inferred task, weights and companion files; nothing is loaded."""
    config = read_config(path)
    safe, pickled = weight_files(path)
    info: dict = {"format": "huggingface", "model_type": config["model_type"],
                  "architectures": config.get("architectures") or [], "size": sum(p.stat().st_size for p in safe + pickled)}
    with contextlib.suppress(BadInputError):
        info["task"] = infer_task(config, path)
    if info.get("task") in TASKS and TASKS[info["task"]].supported and not TASKS[info["task"]].export:
        with contextlib.suppress(Exception):
            info.update(_task_io(config, path, TASKS[info["task"]]))
    if safe:
        info["parameters"] = parameter_count(safe)
    info["weights"] = [p.name for p in safe + pickled]
    info["files"] = [p.name for p in companion_files(path)]
    notes = []
    if config.get("auto_map"):
        notes.append("auto_map: loading runs code from the folder (needs --trust)")
    if pickled and not safe:
        notes.append("only pickled weights (needs --trust)")
    if notes:
        info["note"] = "; ".join(notes)
    return info
