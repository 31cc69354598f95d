"""The text-generation pipeline's options, and the refusals they call for before any work.

`refusals` is called by `request.decide` (every refusal that needs no model is made there); the
pipeline itself is orchestration/text_generation.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from modelport.errors import BadInputError
from modelport.optimize.decoder_auto import DecoderAutoOptions
from modelport.optimize.weight_only import WeightOnlyOptions
from modelport.orchestration.decoder_variants import AUTO, AUTO_PRECISIONS
from modelport.validation.generation import DEFAULT_NEW_TOKENS, GenerationBudget, parse_generation_budget

REFERENCES = ("auto", "transformers", "streamed")
LEVELS = (None, "none", "all", "auto")


@dataclass(frozen=True)
class TextGenerationOptions:
    """Options of the text-generation pipeline: tokens generated per prompt, the weight-only
    quantiser's block size and symmetry, the accuracy budget of quantised artifacts (the run's
    `--accuracy-budget` when not given), and how `--optimize auto` times its variants."""

    new_tokens: int = DEFAULT_NEW_TOKENS
    block_size: int = 32
    symmetric: bool = True
    budget: str | None = None  # "tokens>=0.95,max_abs<=2"
    auto: DecoderAutoOptions = DecoderAutoOptions()
    reference: str = "auto"  # transformers, streamed, or auto: streamed from STREAM_FROM parameters or when the fp32 model does not fit

    def __post_init__(self):
        """Each field's own value, checked where it is declared (as every stage's options class does)."""
        if self.new_tokens < 1:
            raise BadInputError(f"bad --new-tokens {self.new_tokens}: at least 1")
        if self.reference not in REFERENCES:
            raise BadInputError(f"unknown --reference '{self.reference}'; known: {', '.join(REFERENCES)}")
        WeightOnlyOptions(bits=4, block_size=self.block_size, symmetric=self.symmetric)
        parse_generation_budget(self.budget)


def refusals(tg: TextGenerationOptions, level: str | None, precision: str | None, runtimes,
             accuracy_budget: str | None) -> GenerationBudget | None:
    """Exit 2 for what this pipeline cannot deliver with the run's other options: the optimisation
    level, the precision, the reference, the runtimes and the run's budget (`precision`: the one the
    user gave for every target, None for the targets' default); returns the run's generation budget (None: none was given)."""
    if level not in LEVELS:
        raise BadInputError(f"--task text-generation takes --optimize none, all or auto; not {level}")
    if precision == AUTO and level != "auto":
        raise BadInputError(f"--task text-generation: --precision auto lets --optimize auto pick among {', '.join(AUTO_PRECISIONS)}",
                            hint="add --optimize auto, or name one precision")
    if precision == "fp16" and level == "auto":
        raise BadInputError("--task text-generation: --optimize auto times its variants on the CPU, where fp16 is not meant to run",
                            hint="--optimize all --precision fp16 writes the fused fp16 model")
    if tg.reference == "streamed" and level == "auto":
        raise BadInputError("--task text-generation --optimize auto judges its variants against the transformers reference",
                            hint="--reference auto or transformers, or --optimize all")
    if runtimes and tuple(runtimes) != ("onnxruntime",):
        raise BadInputError(f"--task text-generation --optimize auto times onnxruntime variants; not --runtimes {','.join(runtimes)}")
    return parse_generation_budget(tg.budget or accuracy_budget)
