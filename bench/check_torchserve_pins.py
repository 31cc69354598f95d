"""Prove the TorchServe handler pins install on the server image's Python: pip's resolver, dry run.

For every (runtime, device) entry of `modelport.packaging.torchserve_pins.HANDLER_PINS`, runs

    pip install --dry-run --report - --python-version 3.9 --implementation cp --only-binary=:all:
        --platform manylinux_2_31_x86_64 ... --target TMP --ignore-installed PKG==VER ...

and prints what pip would install. Exit 1 when a pin does not resolve. Needs PyPI (not part of the
test suite, which never reaches the network); run it with `make check-pins`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile


def resolve(requirements: list[str], python: str, platforms: tuple[str, ...]) -> tuple[int, list[tuple[str, str]], str]:
    with tempfile.TemporaryDirectory(prefix="modelport-pins-") as target:
        cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--report", "-", "--python-version", python,
               "--implementation", "cp", "--only-binary=:all:", "--target", target, "--ignore-installed"]
        for platform in platforms:
            cmd += ["--platform", platform]
        p = subprocess.run(cmd + requirements, capture_output=True, text=True)
    if p.returncode != 0:
        return p.returncode, [], p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""
    report = json.loads(p.stdout[p.stdout.index("{"):])
    return 0, [(i["metadata"]["name"], i["metadata"]["version"]) for i in report["install"]], ""


def main() -> int:
    from modelport.packaging.torchserve_pins import HANDLER_PINS, IMAGE_PLATFORMS, IMAGE_PYTHON

    failed = 0
    print(f"TorchServe handler pins on CPython {IMAGE_PYTHON}, {IMAGE_PLATFORMS[0]} (binary wheels only)")
    for (runtime, device), pins in HANDLER_PINS.items():
        reqs = [f"{pkg}=={version}" for pkg, version in pins.items()]
        code, installed, error = resolve(reqs, IMAGE_PYTHON, IMAGE_PLATFORMS)
        if code:
            failed += 1
            print(f"FAIL {runtime}/{device}: {' '.join(reqs)}: {error}")
            continue
        print(f"ok   {runtime}/{device}: {' '.join(reqs)} -> {', '.join(f'{n}=={v}' for n, v in installed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
