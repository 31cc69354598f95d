"""Hugging Face model folders: `config.json` + `*.safetensors`, as transformers' `save_pretrained` writes them.

The task (`--task`, else inferred from the config's `architectures`) picks the transformers class
that loads the weights, the inputs built from the config (token ids, masks and type ids;
`pixel_values` at the configured image size; `input_values` or Whisper-style `input_features` for
speech), their named dynamic dims, and the output names. `TASKS` holds one entry per task; a task
exported as several models (text2text and speech recognition: an encoder and a decoder) names its
own export function, and so does `text-generation` (a decoder-only LLM with its KV cache:
parsers/hf_decoder.py; `convert` takes such folders through orchestration/text_generation.py,
which validates them by greedy generation).

Every model goes through the PyTorch parser (`parsers.pytorch.parse` on a module that takes the
inputs positionally and returns the task's outputs): references from transformers in eager mode,
the torch.onnx exporter with its fallbacks. A task exported as several models gives an IR whose
`parts` are one full IR each, converted and validated one by one into `OUT/<part>/`.

Safety: weights load from safetensors only (`use_safetensors=True`, each file's header checked
first); a folder holding only pickled weights (`pytorch_model.bin`) or a config that asks for code
from the folder (`auto_map`, i.e. `trust_remote_code`) is refused (exit 3) unless `trust` is set.
Loading never reaches the network (`local_files_only=True`, `HF_HUB_OFFLINE=1`) and never writes
into the folder. Weights that do not cover the model (a tensor missing from the safetensors, or
of another shape than config.json makes) are refused (exit 2, `weights_problem`): transformers
would fill them with random values, and every reference would agree with the random model.
Tokenizer and preprocessor files are listed in the IR's provenance (`companion_files`); the
convert stage copies them next to the artifacts.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect as pyinspect
import json
import logging
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from modelport.errors import BadInputError, UnsafeInputError
from modelport.ir import IRModel, TensorSpec

NAME = "huggingface"
DESCRIPTION = "Hugging Face model folder (config.json + *.safetensors from save_pretrained); --task picks what to export"

# Files copied next to the artifacts: what a tokenizer, processor or generation loop reads back.
COMPANION_FILES = (
    "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
    "added_tokens.json", "vocab.txt", "vocab.json", "merges.txt", "spiece.model", "sentencepiece.bpe.model",
    "tokenizer.model", "source.spm", "target.spm", "normalizer.json", "preprocessor_config.json", "processor_config.json",
    "feature_extractor_config.json", "image_processor_config.json", "chat_template.jinja", "chat_template.json",
)
PICKLED_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json")
SAMPLE_SEQUENCE = 8  # tokens per sample (within max_position_embeddings)
SAMPLE_AUDIO = 16000  # raw audio samples per sample (one second at 16 kHz)
# Tensors a task's outputs never read, so their absence is no reason to refuse: feature-extraction
# returns last_hidden_state, which the pooler (a head on top of it, absent from masked-LM
# checkpoints such as roberta-base's) does not feed.
UNREAD_BY_TASK = {"feature-extraction": re.compile(r"(^|\.)pooler\.")}


def sniff(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").is_file()


# --- the task table ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Task:
    """One `--task`: the transformers Auto class that loads its model, its outputs (attributes of the
    model's output), the input kinds it takes (None: any; see `input_specs`) and, for a task that
    is not one plain forward pass, the "module:function" that exports it (`export(task, ctx)` ->
    IRModel). `export=None` with `supported=False` is a task named but not built yet."""

    name: str
    auto_class: str
    outputs: tuple[str, ...]
    modalities: tuple[str, ...] | None = None
    export: str | None = None
    supported: bool = True
    description: str = ""


TASKS: dict[str, Task] = {t.name: t for t in (
    Task("feature-extraction", "AutoModel", ("last_hidden_state",),
         description="hidden states of the base model (the encoder of an encoder-decoder: a speech encoder for Whisper)"),
    Task("text-classification", "AutoModelForSequenceClassification", ("logits",), ("text",)),
    Task("token-classification", "AutoModelForTokenClassification", ("logits",), ("text",)),
    Task("question-answering", "AutoModelForQuestionAnswering", ("start_logits", "end_logits"), ("text",)),
    Task("fill-mask", "AutoModelForMaskedLM", ("logits",), ("text",)),
    Task("image-classification", "AutoModelForImageClassification", ("logits",), ("vision",)),
    Task("image-segmentation", "AutoModelForSemanticSegmentation", ("logits",), ("vision",)),
    Task("audio-classification", "AutoModelForAudioClassification", ("logits",), ("audio", "audio-features")),
    Task("text2text-generation", "AutoModelForSeq2SeqLM", ("last_hidden_state", "logits"), ("text",),
         export="modelport.parsers.huggingface:export_seq2seq",
         description="two models: encoder/ (input ids -> hidden states) and decoder/ (decoder ids + hidden states -> logits)"),
    Task("automatic-speech-recognition", "AutoModelForSpeechSeq2Seq", ("last_hidden_state", "logits"), ("audio-features",),
         export="modelport.parsers.huggingface:export_seq2seq",
         description="two models: encoder/ (input_features -> hidden states) and decoder/ (decoder ids + hidden states -> logits)"),
    Task("text-generation", "AutoModelForCausalLM", ("logits",), ("text",), export="modelport.parsers.hf_decoder:export_task",
         description="decoder-only LLMs with a KV cache (convert validates them by greedy generation)"),
)}
TASK_ALIASES = {
    "text2text": "text2text-generation", "seq2seq-lm": "text2text-generation", "sentiment-analysis": "text-classification",
    "sequence-classification": "text-classification", "ner": "token-classification", "masked-lm": "fill-mask",
    "semantic-segmentation": "image-segmentation", "speech-encoder": "feature-extraction", "causal-lm": "text-generation",
    "asr": "automatic-speech-recognition", "speech2text": "automatic-speech-recognition",
}
# architecture name suffix -> task, first match wins (ForSequenceClassification on a speech model is audio)
ARCHITECTURE_TASKS = (
    ("ForSequenceClassification", "text-classification"), ("ForAudioClassification", "audio-classification"),
    ("ForTokenClassification", "token-classification"), ("ForQuestionAnswering", "question-answering"),
    ("ForMaskedLM", "fill-mask"), ("ForImageClassification", "image-classification"),
    ("ForSemanticSegmentation", "image-segmentation"), ("ForConditionalGeneration", "text2text-generation"),
    ("ForSeq2SeqLM", "text2text-generation"), ("ForCausalLM", "text-generation"), ("LMHeadModel", "text-generation"),
    ("EncoderModel", "feature-extraction"), ("Encoder", "feature-extraction"), ("Model", "feature-extraction"),
)
# (task of the architecture's name, the model's input kind) -> the task it is for that input
MODALITY_TASKS = {
    ("text-classification", "audio"): "audio-classification", ("text-classification", "audio-features"): "audio-classification",
    ("text2text-generation", "audio-features"): "automatic-speech-recognition",
}
# the model class's main input -> the kind of inputs built for it
MODALITIES = {"input_ids": "text", "pixel_values": "vision", "input_values": "audio", "input_features": "audio-features"}


def task_name(name: str) -> str:
    """The canonical task for `name` (aliases resolved); exit 2 listing the known tasks."""
    key = name.strip().lower().replace("_", "-")
    key = TASK_ALIASES.get(key, key)
    if key not in TASKS:
        raise BadInputError(f"unknown task '{name}'; known: {', '.join(TASKS)}")
    return key


# --- reading the folder ----------------------------------------------------------------------------


def read_config(folder: Path) -> dict:
    path = folder / "config.json"
    confined(path, folder)
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BadInputError(f"cannot read config.json: {str(e).splitlines()[0]}", path=folder) from None
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise BadInputError("config.json has no model_type (not a transformers model folder)", path=folder)
    return config


def confined(path: Path, folder: Path) -> bool:
    """True for a regular file of the folder; a symlink must resolve inside the folder or, in the
    Hugging Face cache's layout (`models--org--name/snapshots/REV/file -> ../../blobs/SHA`), inside
    the cached repository; one that leads elsewhere is refused (exit 3)."""
    if not path.is_symlink():
        return path.is_file()
    target = path.resolve()
    roots = [folder.resolve()]
    if folder.resolve().parent.name == "snapshots":
        roots.append(folder.resolve().parent.parent)
    if not any(target.is_relative_to(r) for r in roots):
        raise UnsafeInputError(f"{path.name} links outside the model folder", path=folder)
    return target.is_file()


def weight_files(folder: Path) -> tuple[list[Path], list[Path]]:
    """(safetensors files, pickled weight files) of the folder."""
    safe = sorted(p for p in folder.glob("*.safetensors") if confined(p, folder))
    pickled = sorted(p for p in folder.iterdir() if (p.name in PICKLED_WEIGHTS or re.fullmatch(r"pytorch_model-\d+-of-\d+\.bin", p.name))
                     and confined(p, folder))
    return safe, pickled


def check_safety(folder: Path, config: dict, *, trust: bool) -> bool:
    """Refuse (exit 3) what would run code from the folder, unless trusted; True: load safetensors."""
    if config.get("auto_map") and not trust:
        raise UnsafeInputError("config.json has auto_map: loading runs Python code from the folder (trust_remote_code)",
                               path=folder, hint="pass --trust if you trust it")
    safe, pickled = weight_files(folder)
    if safe:
        from modelport.parsers.pytorch import check_safetensors_header

        for f in safe:
            check_safetensors_header(f)
        return True
    if pickled:
        if not trust:
            raise UnsafeInputError(f"only pickled weights ({pickled[0].name}), no *.safetensors: unpickling can run code",
                                   path=folder, hint="pass --trust if you trust the file, or save the model with safetensors")
        return False
    raise BadInputError("no weights: the folder holds no *.safetensors", path=folder)


def companion_files(folder: Path) -> list[Path]:
    return [folder / n for n in COMPANION_FILES if confined(folder / n, folder)]


@contextlib.contextmanager
def offline():
    """No network during the block (HF_HUB_OFFLINE), transformers' logging and progress bars quiet,
    Python-level stdout on stderr."""
    saved = {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    try:
        from modelport.deps import require

        transformers = require("transformers", purpose="Hugging Face model folders")
        # torchao, which transformers imports with its model classes when it is installed, logs
        # through its own logger and torch's _pytree one
        for name in ("torchao", "torch.utils._pytree"):
            logging.getLogger(name).setLevel(logging.ERROR)
        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()
        with contextlib.redirect_stdout(sys.stderr):
            yield transformers
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def transformers_class(transformers, name: str, model_type: str):
    """A class transformers itself defines (never code from the folder), or None."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name or ""):
        return None
    found = getattr(transformers, name, None)
    if found is None and re.fullmatch(r"[a-z0-9_]+", model_type.replace("-", "_")):
        with contextlib.suppress(Exception):
            module = importlib.import_module(f"transformers.models.{model_type.replace('-', '_')}.modeling_{model_type.replace('-', '_')}")
            found = getattr(module, name, None)
    return found if isinstance(found, type) and hasattr(found, "from_pretrained") else None


def modality_of(cls) -> str | None:
    return MODALITIES.get(getattr(cls, "main_input_name", None))


def infer_task(config: dict, folder: Path, transformers=None) -> str:
    """The task of the config's first architecture; exit 2 when there is none to infer from."""
    archs = [a for a in config.get("architectures") or [] if isinstance(a, str)]
    if not archs:
        raise BadInputError("config.json names no architectures to infer the task from", path=folder,
                            hint=f"pass --task with one of {', '.join(TASKS)}")
    arch = archs[0]
    for suffix, task in ARCHITECTURE_TASKS:
        if arch.endswith(suffix):
            if transformers is not None and any(t == task for t, _ in MODALITY_TASKS):
                cls = transformers_class(transformers, arch, config["model_type"])
                return MODALITY_TASKS.get((task, modality_of(cls)), task)
            return task
    raise BadInputError(f"cannot infer a task from architecture {arch}", path=folder,
                        hint=f"pass --task with one of {', '.join(TASKS)}")


# --- inputs built from the config ----------------------------------------------------------------


def _forward_params(module) -> set[str]:
    try:
        return set(pyinspect.signature(module.forward).parameters)
    except (TypeError, ValueError):
        return set()


def _image_size(config, folder: Path) -> tuple[int, int]:
    size = getattr(config, "image_size", None)
    if isinstance(size, int):
        return size, size
    if isinstance(size, (list, tuple)) and len(size) == 2:
        return int(size[0]), int(size[1])
    with contextlib.suppress(OSError, ValueError, AttributeError):
        pre = json.loads((folder / "preprocessor_config.json").read_text(encoding="utf-8"))
        for key in ("crop_size", "size"):
            value = pre.get(key)
            if isinstance(value, int):
                return value, value
            if isinstance(value, dict) and "height" in value and "width" in value:
                return int(value["height"]), int(value["width"])
    return 224, 224


def input_specs(modality: str, config, module, folder: Path) -> tuple[list[TensorSpec], dict[str, int]]:
    """(input specs, sample dims) for the inputs of `modality` that `module` takes.

    text: input_ids (ids within vocab_size), attention_mask (ones), token_type_ids where the model
    takes them, all [batch, sequence]; vision: pixel_values [batch, num_channels, H, W] at the
    configured image size; audio: raw input_values [batch, samples]; audio-features: Whisper-style
    input_features [batch, num_mel_bins, 2 * max_source_positions].
    """
    params = _forward_params(module)
    if modality == "text":
        vocab = int(getattr(config, "vocab_size", 0) or 0)
        if vocab < 1:
            raise BadInputError("config.json has no vocab_size to draw sample token ids from", path=folder)
        specs = [TensorSpec("input_ids", "int64", ["batch", "sequence"], "NT", value_range=[0, vocab])]
        if "attention_mask" in params:
            specs.append(TensorSpec("attention_mask", "int64", ["batch", "sequence"], "NT", value_range=[1, 2]))
        types = int(getattr(config, "type_vocab_size", 0) or 0)
        if "token_type_ids" in params and types > 0:
            specs.append(TensorSpec("token_type_ids", "int64", ["batch", "sequence"], "NT", value_range=[0, types]))
        limit = int(getattr(config, "max_position_embeddings", 0) or 0)
        return specs, {"sequence": min(SAMPLE_SEQUENCE, limit) if limit > 0 else SAMPLE_SEQUENCE}
    if modality == "vision":
        h, w = _image_size(config, folder)
        channels = int(getattr(config, "num_channels", 3) or 3)
        return [TensorSpec("pixel_values", "float32", ["batch", channels, h, w], "NCHW")], {}
    if modality == "audio":
        return [TensorSpec("input_values", "float32", ["batch", "samples"], "NT")], {"samples": SAMPLE_AUDIO}
    if modality == "audio-features":
        mels, positions = getattr(config, "num_mel_bins", None), getattr(config, "max_source_positions", None)
        if not (isinstance(mels, int) and isinstance(positions, int)):
            raise BadInputError(f"cannot size input_features from the {config.model_type} config (no num_mel_bins/max_source_positions)",
                                path=folder, hint="pass --input input_features:SHAPE")
        return [TensorSpec("input_features", "float32", ["batch", mels, 2 * positions], "NCW")], {}
    raise BadInputError(f"no inputs known for a model whose main input is '{modality}'", path=folder)


def apply_user_specs(specs: list[TensorSpec], user: list[TensorSpec]) -> list[TensorSpec]:
    """`--input` overrides by name (shape, dtype, range), as for other sources."""
    if not user:
        return specs
    from modelport.parsers.contract import merge_specs

    return merge_specs(specs, user)


# --- loading and exporting -----------------------------------------------------------------------


@dataclass
class Context:
    """What a task's export function gets: the folder, its config, the user's spec and the loader."""

    folder: Path
    config: dict
    spec: object  # SourceSpec
    load: Callable[[Task], object]  # task -> the loaded nn.Module (eval mode, float32)
    transformers: object


def load_model(task: Task, ctx_folder: Path, config: dict, *, trust: bool, safetensors: bool, inferred: bool, transformers):
    """The model for `task`: the class the config names when the task was inferred from it (it may
    be no Auto class's, e.g. WhisperEncoder), else the task's Auto class. A class that does not fit
    the config, or weights that do not cover it (`weights_problem`), is exit 2."""
    torch = importlib.import_module("torch")
    arch = (config.get("architectures") or [None])[0]
    cls = transformers_class(transformers, arch, config["model_type"]) if inferred and arch else None
    if cls is None:
        cls = getattr(transformers, task.auto_class)
    # mismatched sizes come back in the loading report instead of as a RuntimeError after it
    kwargs = dict(local_files_only=True, use_safetensors=safetensors, trust_remote_code=trust and bool(config.get("auto_map")),
                  dtype=torch.float32, output_loading_info=True, ignore_mismatched_sizes=True)
    try:
        try:
            model, info = cls.from_pretrained(str(ctx_folder), attn_implementation="eager", **kwargs)
        except (ValueError, TypeError) as e:
            if "attn" not in str(e).lower() and "attention" not in str(e).lower():
                raise
            model, info = cls.from_pretrained(str(ctx_folder), **kwargs)
    except (ValueError, KeyError, OSError, TypeError, AttributeError, RuntimeError) as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise BadInputError(f"task {task.name} does not fit this {config['model_type']} model: {reason[:300]}",
                            path=ctx_folder) from None
    unread = UNREAD_BY_TASK.get(task.name)
    missing = [k for k in info.get("missing_keys") or [] if not (unread and unread.search(k))]
    problem = weights_problem({**info, "missing_keys": missing})
    if problem:
        built = type(model).__name__
        if not inferred and arch and built != arch and not info.get("mismatched_keys"):
            # a task asked for whose head the checkpoint never had: the head would be random
            trained = None
            with contextlib.suppress(BadInputError):
                trained = infer_task(config, ctx_folder, transformers)
            hint = f"the checkpoint is a {arch}: the weights of {built}'s {task.name} head are absent"
            if trained and trained != task.name:
                hint += f"; convert it as {trained}, or use a checkpoint trained for {task.name}"
            raise BadInputError(f"task {task.name} needs weights the checkpoint lacks: {problem}", path=ctx_folder, hint=hint)
        raise BadInputError(f"the weights do not fit config.json: {problem}", path=ctx_folder)
    model.config.use_cache = False
    return model.eval()


def weights_problem(info: dict) -> str | None:
    """What transformers' loading report (`from_pretrained(output_loading_info=True,
    ignore_mismatched_sizes=True)`) says is wrong, in one line, or None.

    transformers fills a tensor the weights lack, or whose shape differs from what config.json
    makes, with random values and goes on (it only logs a table): the export and every reference
    would then agree on a partly random model. Its `missing_keys` already leave out what it
    legitimately fills itself: tied weights whose source the checkpoint holds (`tie_weights`
    removes them) and the patterns the model class declares ignorable
    (`_keys_to_ignore_on_load_missing`, e.g. `num_batches_tracked`, BART's zero
    `final_logits_bias`); buffers that are not persistent are never expected.
    """
    mismatched = sorted(info.get("mismatched_keys") or [], key=lambda m: m[0])
    missing = sorted(info.get("missing_keys") or [])
    if mismatched:
        name, stored, wanted = mismatched[0]
        return (f"{name} is {list(stored)} in the weights but {list(wanted)} by the config"
                f"{f' ({len(mismatched)} tensors differ)' if len(mismatched) > 1 else ''}")
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        return f"no {missing[0]}{more} in the weights (transformers would initialise {'them' if more else 'it'} at random)"
    return None


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
    from modelport.parsers import pytorch
    from modelport.specs import SourceSpec

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


def parameter_count(files: list[Path]) -> int:
    """The number of parameters in safetensors `files`, read from their headers (nothing is loaded)."""
    from modelport.parsers.pytorch import check_safetensors_header

    params = 0
    for f in files:
        for key, t in check_safetensors_header(f).items():
            if key != "__metadata__":
                n = 1
                for d in t.get("shape", []):
                    n *= int(d)
                params += n
    return params


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
