"""Every benchmark still runs against today's code: its imports resolve and its options parse.

The benchmarks are not run here (they take minutes and measure a quiet machine), but a renamed
or removed name they import would otherwise surface only when someone next runs them.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
SCRIPTS = [*sorted(BENCHMARKS.glob("bench_*.py")), BENCHMARKS / "plot_cost_curves.py"]
# Modules the scripts start as servers or workers: imported, not run.
HELPERS = ["bare_endpoint", "loadgen", "memory", "serving"]


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


def test_the_cost_curves_plot_draws_what_bench_cluster_wrote(tmp_path):
    rows = [
        {"items": n, "method": method, "seconds": seconds, "driver_peak": 2**28, "ratio": 1.0}
        | ({"worker_peak": 2**28} if method == "cluster" else {})
        for n, method, seconds in ((1000, "one", 1.0), (1000, "cluster", 3.0),
                                   (10000, "one", 4.0), (10000, "cluster", 6.0))
    ]  # fmt: skip
    (tmp_path / "run.json").write_text(json.dumps(rows))
    out = tmp_path / "curves.png"
    subprocess.run(
        [sys.executable, str(BENCHMARKS / "plot_cost_curves.py"), "--out", str(out),
         f"2 cores={tmp_path / 'run.json'}"],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
