"""The report's PNG figures (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path

from training.evaluation.report_data import Report, configuration_label, diagnostics_by_measure

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError as error:  # pragma: no cover - depends on the installation
    raise ImportError(
        "the report's plots need matplotlib: pip install 'besvm[report]' (make setup does)"
    ) from error

_DPI = 110


def write_all(report: Report, out: Path) -> dict[str, str]:
    """Draw every figure into ``out``; returns their file names by role."""
    figures = {
        "basis_size": _accuracy_against_basis_size(report),
        "parameters": _accuracy_against_parameters(report),
        "normalizations": _normalizations(report),
        "eigen": _eigen_diagnostics(report),
    }
    names = {}
    for role, figure in figures.items():
        name = f"{role}.png"
        figure.savefig(out / name, dpi=_DPI, bbox_inches="tight")
        plt.close(figure)
        names[role] = name
    return names


def _reference_lines(axes, report: Report) -> None:
    for baseline, style in zip(report.baselines[:2], ("--", ":"), strict=False):
        axes.axhline(100 * baseline.accuracy, color="black", linestyle=style, label=baseline.method)


def _default_records(report: Report):
    grid = report.grid
    for configuration in grid.configurations:
        records = [
            report.find(configuration, size, grid.strategies[0], grid.normalizations[0])
            for size in grid.basis_sizes
        ]
        yield configuration, [r for r in records if r is not None]


def _accuracy_against_basis_size(report: Report):
    figure, axes = plt.subplots(figsize=(8, 5))
    for configuration, records in _default_records(report):
        axes.plot(
            [r.basis_per_class for r in records],
            [100 * r.test_accuracy for r in records],
            marker="o",
            label=configuration.label,
        )
    _reference_lines(axes, report)
    _log_accuracy_axes(
        axes, f"{report.dataset}: accuracy against basis size", "basis items per class"
    )
    axes.set_xticks(report.grid.basis_sizes, [str(s) for s in report.grid.basis_sizes])
    axes.minorticks_off()  # log-scale minor labels (3x10^1, ...) would clutter the sizes
    return figure


def _log_accuracy_axes(axes, title: str, xlabel: str) -> None:
    axes.set_xscale("log")
    axes.set_xlabel(xlabel)
    axes.set_ylabel("test accuracy (%)")
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))


def _accuracy_against_parameters(report: Report):
    figure, axes = plt.subplots(figsize=(8, 5))
    for configuration, records in _default_records(report):
        axes.plot(
            [r.n_parameters for r in records],
            [100 * r.test_accuracy for r in records],
            marker="o",
            label=f"BE-SVM {configuration.label}",
        )
    nystroem = [b for b in report.baselines if b.method.startswith("Nystroem")]
    if nystroem:
        axes.plot(
            [b.n_parameters for b in nystroem],
            [100 * b.accuracy for b in nystroem],
            color="black",
            marker="s",
            linestyle="-.",
            label="Nystroem(RBF) + LinearSVC",
        )
    for baseline, marker in zip(report.baselines[:2], ("v", "*"), strict=False):
        axes.scatter(
            [baseline.n_parameters],
            [100 * baseline.accuracy],
            color="black",
            marker=marker,
            s=90,
            zorder=3,
            label=baseline.method,
        )
    _log_accuracy_axes(axes, f"{report.dataset}: accuracy against model size", "model parameters")
    return figure


def _normalizations(report: Report):
    grid = report.grid
    figure, axes = plt.subplots(figsize=(9, 5))
    width = 0.8 / len(grid.normalizations)
    for n, normalization in enumerate(grid.normalizations):
        heights = []
        for configuration in grid.configurations:
            record = report.find(
                configuration, grid.reference_size, grid.strategies[0], normalization
            )
            heights.append(100 * record.test_accuracy if record else 0.0)
        axes.bar(
            [c + n * width for c in range(len(grid.configurations))],
            heights,
            width=width,
            label=normalization,
        )
    axes.set_xticks(
        [c + 0.4 - width / 2 for c in range(len(grid.configurations))],
        [c.label for c in grid.configurations],
        rotation=30,
        ha="right",
        fontsize=7,
    )
    lowest = min(
        (100 * r.test_accuracy for r in report.records if r.basis_per_class == grid.reference_size),
        default=0.0,
    )
    axes.set_ylim(max(0.0, lowest - 5), 100)
    axes.set_ylabel("test accuracy (%)")
    axes.set_title(f"{report.dataset}: normalisations, {grid.reference_size} bases per class")
    axes.grid(alpha=0.3, axis="y")
    axes.legend(fontsize=7)
    return figure


def _eigen_diagnostics(report: Report):
    diagnostics = diagnostics_by_measure(report)
    labels = [configuration_label(transform, name) for transform, name in diagnostics]
    figure, axes = plt.subplots(figsize=(8, 4.5))
    positions = range(len(labels))
    axes.bar(
        [p - 0.2 for p in positions], [d["ngrat"] for d in diagnostics.values()], 0.4, label="NgRat"
    )
    axes.bar(
        [p + 0.2 for p in positions],
        [d["ngeng"] or 0.0 for d in diagnostics.values()],
        0.4,
        label="NgEng",
    )
    axes.set_xticks(list(positions), labels, rotation=30, ha="right", fontsize=7)
    axes.set_ylabel("ratio")
    axes.set_title(f"{report.dataset}: negative eigenvalues of the basis Gram matrices")
    axes.grid(alpha=0.3, axis="y")
    axes.legend()
    return figure
