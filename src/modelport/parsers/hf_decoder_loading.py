"""The transformers model of a decoder folder, in fp32 and eval mode, loaded offline from
safetensors only: through `from_pretrained`, or tensor by tensor for the checkpoints the decoder
writer (parsers/hf_decoder_graph.py) checked.
"""

from __future__ import annotations

import contextlib
import io
import logging
from pathlib import Path

from modelport.deps import require
from modelport.errors import BadInputError, one_line
from modelport.parsers.hf_decoder_config import read_decoder_config
from modelport.parsers.hf_folder import weight_files
from modelport.parsers.hf_loading import offline, weights_problem


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

    with offline(), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            model, info = transformers.AutoModelForCausalLM.from_pretrained(
                str(folder), local_files_only=True, use_safetensors=True, dtype=torch.float32, output_loading_info=True,
                ignore_mismatched_sizes=True)
        except Exception as e:
            raise BadInputError(f"transformers cannot load the folder: {one_line(e)}",
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
