"""typer's help renderer imported without rich.markdown/rich.traceback: both still work when used."""

from __future__ import annotations

import json
import subprocess
import sys

# Run in a fresh process: in pytest's own, typer.rich_utils may already be imported in full.
PROBE = """
import json, sys
import modelport.cli
import typer.rich_utils as rich_utils
before = sorted(m for m in ("rich.markdown", "rich.traceback", "markdown_it", "pygments") if m in sys.modules)
md = rich_utils._make_rich_text(text="*x*", markup_mode="markdown")
try:
    raise RuntimeError("boom")
except RuntimeError as e:
    tb = rich_utils.get_traceback(e, rich_utils.DeveloperExceptionConfig(), [])
import rich.markdown, rich.traceback
print(json.dumps({"before": before, "markdown": type(md) is rich.markdown.Markdown,
                  "traceback": type(tb) is rich.traceback.Traceback,
                  "isinstance": isinstance(md, rich_utils.Markdown),
                  "real_modules": [bool(getattr(sys.modules[m], "__file__", None)) for m in ("rich.markdown", "rich.traceback")]}))
"""


def test_markdown_and_traceback_are_imported_on_first_use():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=120)
    got = json.loads(out.stdout)
    assert got == {"before": [], "markdown": True, "traceback": True, "isinstance": True, "real_modules": [True, True]}
