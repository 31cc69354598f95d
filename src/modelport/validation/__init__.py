"""Validation: the tolerance policy, the one comparator and the run record (report).

Every stage that proves a hop (parsers' references, optimisation passes, emitters, packagers,
the orchestration on top) judges outputs through this package, so it sits below them all and
imports none of them. Divergence localisation lives in `validation.localize` (it needs
onnxruntime, so it is not imported here).
"""

from __future__ import annotations

from modelport.validation.compare import OutputParity, ParityResult, check, compare, compare_arrays
from modelport.validation.report import SCHEMA, Report, json_default, tool_versions
from modelport.validation.tolerance import (
    DEFAULT_TOLERANCES,
    KEYS,
    Tolerance,
    check_override_names,
    parse_tolerance_flags,
    tolerance_for,
)

__all__ = [
    "DEFAULT_TOLERANCES", "KEYS", "SCHEMA", "OutputParity", "ParityResult", "Report", "Tolerance", "check",
    "check_override_names", "compare", "compare_arrays", "json_default", "parse_tolerance_flags", "tolerance_for",
    "tool_versions",
]
