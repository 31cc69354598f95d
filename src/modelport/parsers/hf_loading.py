"""Loading a Hugging Face folder's model with transformers: offline, from local files only, and
refused when its weights do not cover the model transformers builds from config.json."""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import re
import sys
from pathlib import Path

from modelport.errors import BadInputError, one_line
from modelport.parsers.hf_tasks import Task, infer_task, transformers_class

# Tensors a task's outputs never read, so their absence is no reason to refuse: feature-extraction
# returns last_hidden_state, which the pooler (a head on top of it, absent from masked-LM
# checkpoints such as roberta-base's) does not feed.
UNREAD_BY_TASK = {"feature-extraction": re.compile(r"(^|\.)pooler\.")}


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
        reason = one_line(e, 300)
        raise BadInputError(f"task {task.name} does not fit this {config['model_type']} model: {reason}",
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
