"""The Hugging Face parser's tasks: what each `--task` loads, takes and returns, and the task a
folder's config.json implies when none is given.

`TASKS` holds one entry per task (its transformers Auto class, outputs, input kinds and, for a task
that is not one plain forward pass, the function that exports it). The task is inferred from the
config's first architecture by its name's suffix (`...ForSequenceClassification`), refined by the
class's main input (a speech model's `ForSequenceClassification` is audio classification); only
classes transformers itself defines are looked up, never code from the folder.
"""

from __future__ import annotations

import contextlib
import importlib
import re
from dataclasses import dataclass
from pathlib import Path

from modelport.errors import BadInputError


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
