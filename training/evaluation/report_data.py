"""The report's data: the grid it trains, one record per fit, and the whole report.

Shared by :mod:`training.evaluation.report` (which runs the grid and writes the Markdown) and
:mod:`training.evaluation.plots` (which draws the figures), so that neither imports the other's
internals.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from training.estimator.preparation import DEFAULT_MIN_DF, DEFAULT_STOP_WORDS

if TYPE_CHECKING:
    from training.evaluation.held_out import MethodResult

DEFAULT_BASIS_SIZES = (5, 10, 25, 50, 100)
DEFAULT_STRATEGIES = ("index", "random", "kmedoids")
DEFAULT_NORMALIZATIONS = (
    "besvm",
    "none",
    "zscore",
    "nystroem(clip)",
    "nystroem(flip)",
    "nystroem(square)",
)


@dataclass(frozen=True)
class Configuration:
    """An input transform, the similarity measures on it and the SVM's C: one line of the
    plots."""

    transform: str
    similarities: str
    C: float = 1.0

    @property
    def label(self) -> str:
        label = configuration_label(self.transform, self.similarities)
        return label if self.C == 1.0 else f"{label} [C={self.C:g}]"


def configuration_label(transform: str, similarities: str) -> str:
    """``similarities``, prefixed by the transform unless it leaves the inputs as they are."""
    return similarities if transform in ("pixels", "none") else f"{transform}: {similarities}"


@dataclass
class FitRecord:
    """One fitted configuration and its numbers."""

    configuration: Configuration
    basis_per_class: int
    basis_strategy: str
    normalization: str
    n_basis: int
    n_parameters: int
    validation_accuracy: float
    test_accuracy: float
    train_seconds: float
    predict_us_per_sample: float
    diagnostics: dict[str, dict[str, float]]
    warnings: list[str] = field(default_factory=list)

    @property
    def key(self) -> tuple:
        return (self.configuration, self.basis_per_class, self.basis_strategy, self.normalization)


@dataclass
class ReportGrid:
    """What the report trains."""

    configurations: tuple[Configuration, ...]
    basis_sizes: tuple[int, ...] = DEFAULT_BASIS_SIZES
    strategies: tuple[str, ...] = DEFAULT_STRATEGIES
    normalizations: tuple[str, ...] = DEFAULT_NORMALIZATIONS
    reference_size: int = 25
    folds: int = 3
    seed: int = 0
    repeats: int = 3
    # Documents: the vocabulary of every fit and of the baselines (the estimator's parameters).
    min_df: int = DEFAULT_MIN_DF
    stop_words: str | None = DEFAULT_STOP_WORDS

    def fits(self) -> list[tuple[Configuration, int, str, str]]:
        """Every distinct (configuration, basis per class, strategy, normalisation) to train."""
        default_strategy, default_normalization = self.strategies[0], self.normalizations[0]
        wanted = []
        for configuration in self.configurations:
            wanted += [
                (configuration, size, default_strategy, default_normalization)
                for size in self.basis_sizes
            ]
            wanted += [
                (configuration, self.reference_size, strategy, default_normalization)
                for strategy in self.strategies
            ]
            wanted += [
                (configuration, self.reference_size, default_strategy, normalization)
                for normalization in self.normalizations
            ]
        return list(dict.fromkeys(wanted))


@dataclass
class Report:
    """Everything the Markdown and the plots are made from."""

    dataset: str
    n_train: int
    n_validation: int  # items held out across all folds
    n_test: int
    n_classes: int
    grid: ReportGrid
    records: list[FitRecord]
    baselines: list[MethodResult]

    def best(self) -> FitRecord:
        """Highest validation accuracy; ties go to the smaller model."""
        return max(self.records, key=lambda r: (r.validation_accuracy, -r.n_parameters))

    def find(self, configuration, size, strategy, normalization) -> FitRecord | None:
        for record in self.records:
            if record.key == (configuration, size, strategy, normalization):
                return record
        return None

    def to_dict(self) -> dict:
        return {
            "dataset": self.dataset,
            "n_train": self.n_train,
            "n_validation": self.n_validation,
            "n_test": self.n_test,
            "grid": asdict(self.grid),
            "records": [asdict(r) for r in self.records],
            "baselines": [asdict(b) for b in self.baselines],
            "best": asdict(self.best()),
        }


def diagnostics_by_measure(report: Report) -> dict[tuple[str, str], dict[str, float]]:
    """NgRat/NgEng of every measure at the reference size, default strategy, per transform."""
    grid = report.grid
    found: dict[tuple[str, str], dict[str, float]] = {}
    for record in report.records:
        if (record.basis_per_class, record.basis_strategy, record.normalization) != (
            grid.reference_size,
            grid.strategies[0],
            grid.normalizations[0],
        ):
            continue
        for name, values in record.diagnostics.items():
            found.setdefault((record.configuration.transform, name), values)
    return found
