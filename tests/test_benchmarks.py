"""Every benchmark still runs against today's code: its imports resolve and its options parse.

The benchmarks are not run here (they take minutes and measure a quiet machine), but a renamed
or removed name they import would otherwise surface only when someone next runs them.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
SCRIPTS = sorted(BENCHMARKS.glob("bench_*.py"))
# Modules the scripts start as servers or workers: imported, not run.
HELPERS = ["bare_endpoint", "loadgen", "serving"]


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.stem for s in SCRIPTS])
def test_every_benchmark_answers_help(script):
    result = subprocess.run(
        [sys.executable, str(script), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "usage:" in result.stdout


@pytest.mark.parametrize("name", HELPERS)
def test_every_benchmark_helper_imports(name):
    # No side effect beyond definitions: each one starts its work from __main__ only.
    assert importlib.import_module(f"benchmarks.{name}").__doc__
