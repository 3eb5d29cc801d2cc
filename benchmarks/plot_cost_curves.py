"""Plot cost curves that ``benchmarks/bench_cluster.py --json`` wrote: fit seconds and peak
memory against the number of items, one process against the cluster, one line per machine.

    .venv/bin/python benchmarks/plot_cost_curves.py \\
        --out docs/measurements/reports/cost-curves/cost-curves.png \\
        "2 cores=run-a.json,run-b.json" "16 cores=run-c.json"

Each argument is ``LABEL=FILE[,FILE...]``: the rows of the files are one machine's curves (a size
measured twice keeps its last row). The left panel is seconds, the right the peak resident memory
of the process that fits (one process) or of the driver and the largest worker (the cluster),
both on log-log axes.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def _rows(files: str) -> dict[tuple[int, str], dict]:
    rows = {}
    for name in files.split(","):
        for row in json.loads(Path(name).read_text()):
            rows[(int(row["items"]), row["method"])] = row
    return rows


def _line(rows, method: str, key: str) -> tuple[list[int], list[float]]:
    points = sorted((n, row[key]) for (n, m), row in rows.items() if m == method and key in row)
    points = [(n, v) for n, v in points if v is not None and not math.isnan(v)]
    return [n for n, _ in points], [v for _, v in points]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("machines", nargs="+", help="LABEL=FILE[,FILE...]")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    figure, (time_axis, memory_axis) = plt.subplots(1, 2, figsize=(11, 4.2))
    for index, machine in enumerate(args.machines):
        label, _, files = machine.partition("=")
        rows = _rows(files)
        color = f"C{index}"
        for method, style, name in (("one", "-o", "one process"), ("cluster", "--s", "cluster")):
            x, y = _line(rows, method, "seconds")
            time_axis.plot(x, y, style, color=color, label=f"{label}: {name}")
            x, y = _line(rows, method, "driver_peak")
            what = "driver" if method == "cluster" else "one process"
            memory_axis.plot(x, [v / 2**30 for v in y], style, color=color,
                             label=f"{label}: {what}")  # fmt: skip
        x, y = _line(rows, "cluster", "worker_peak")
        memory_axis.plot(x, [v / 2**30 for v in y], ":^", color=color, label=f"{label}: a worker")
    for axis, title, unit in ((time_axis, "fit time", "seconds"),
                              (memory_axis, "peak memory", "GiB")):  # fmt: skip
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.set_xlabel("training items (64 features, 10 classes, B = 1,000)")
        axis.set_ylabel(unit)
        axis.set_title(title)
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize=7)
    figure.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
