"""onnxruntime-genai: an ort-genai folder (genai_config.json, the decoder model, the tokenizer) run by
the runtime's own generator, as its users run it (`og.Model(folder)`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from modelport.deps import require
from modelport.ir import TensorSpec
from modelport.runtimes.base import Capabilities, Runner

RUNTIME = "onnxruntime-genai"


class OrtGenAIRunner(Runner):
    """A folder onnxruntime-genai loads; it generates (`generates`) rather than running one step."""

    name = RUNTIME
    imports = ("onnxruntime_genai", "onnxruntime")
    capabilities = Capabilities(generates=True)

    def __init__(self, model, **options):
        self.path = Path(model)

    def input_specs(self) -> list[TensorSpec]:
        raise NotImplementedError("an ort-genai folder is run by its generator: see generate()")

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        raise NotImplementedError("an ort-genai folder is run by its generator: see generate()")

    def generate(self, prompts: list[list[int]], new_tokens: int, vocab_size: int):
        """(tokens, logits, producer): greedy generation by onnxruntime-genai's own search, one prompt
        at a time, with the logits it chose each token from. A row that stops early at an
        end-of-sequence token is marked -1 after it (those positions are not compared)."""

        og = require("onnxruntime_genai", purpose="--to ort-genai validation")
        model = og.Model(str(self.path))
        tokens = np.full((len(prompts), new_tokens), -1, dtype=np.int64)
        logits = np.zeros((len(prompts), new_tokens, vocab_size), dtype=np.float32)
        for r, prompt in enumerate(prompts):
            params = og.GeneratorParams(model)
            params.set_search_options(max_length=len(prompt) + new_tokens, do_sample=False)
            gen = og.Generator(model, params)
            gen.append_tokens(np.array([prompt], dtype=np.int32))
            for step in range(new_tokens):
                if gen.is_done():
                    break
                logits[r, step] = np.asarray(gen.get_logits(), dtype=np.float32).reshape(-1)[-vocab_size:]
                gen.generate_next_token()
                tokens[r, step] = int(gen.get_next_tokens()[0])
        return tokens, logits, f"onnxruntime-genai {og.__version__}"
