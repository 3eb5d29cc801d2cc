"""The evaluation report: a grid of BE-SVM configurations on one data set, written as Markdown
with PNG plots (``python -m training report --help``).

Three sweeps share one set of *configurations* (an input transform and one or more similarity
measures):

- basis size: every configuration at every basis size, with the default strategy and
  normalisation;
- basis strategy: every configuration and strategy at the reference size;
- normalisation: every configuration and normalisation at the reference size.

Every setting is scored on the test split, and by stratified k-fold cross-validation within the
training split; the *best* configuration is chosen by cross-validated accuracy, so the test split
never picks the winner. Baselines (LinearSVC,
SVC(RBF), Nystroem + LinearSVC) are trained on the same inputs.

The cross-validation's fits (settings x folds: most of a report's work) can run on a Dask
cluster (``--cluster``): each is a task, through joblib's Dask backend, with the data set
scattered to the workers once; the scores are those of one process. The final fit of each
setting, whose training and prediction times the report shows, stays in this process, so that
times compare across settings and with the baselines.

The grid, the records and the report itself are defined in
:mod:`training.evaluation.report_data`, which :mod:`training.evaluation.plots` reads too (plots
does not import this module).
"""

from __future__ import annotations

import dataclasses
import json
import math
import platform
import re
from collections.abc import Sequence
from pathlib import Path

from joblib import Parallel, delayed, parallel_config
from sklearn.model_selection import StratifiedKFold
from tqdm.auto import tqdm

from service.model import SpecError, parse_specs
from service.model.features import parse_normalization
from service.model.inputs.kinds import input_kind_for_data
from service.model.similarity import format_spec
from training.cluster.connection import client_for
from training.data.datasets import Dataset
from training.estimator.basis import BASIS_STRATEGIES
from training.estimator.diagnostics import format_ratio
from training.estimator.preparation import DEFAULT_MIN_DF, DEFAULT_STOP_WORDS, fit_vocabulary
from training.evaluation.held_out import (
    evaluate_baselines,
    evaluate_text_baselines,
    median_seconds,
    predictor_parameters,
)
from training.evaluation.report_data import (
    Configuration,
    FitRecord,
    Report,
    ReportGrid,
    diagnostics_by_measure,
)
from training.fitting import fit_dataset

DEFAULT_CONFIGURATIONS = (
    "linear",
    "rbf(gamma=1)",
    "rigid(h=1)",
    "deformable(h_r=1, h_l=1)",
    "rbf(gamma=1) + rigid(h=1)",
    "rbf(gamma=1) + deformable(h_r=1, h_l=1)",
    "hog(cell_size=2, orientations=9): rigid(h=1)",
    "hog(cell_size=2, orientations=9): rbf(gamma=1) + rigid(h=1)",
)
# The text report's: the sensing measures alone, tf-idf's linear alone, and combined.
TEXT_CONFIGURATIONS = (
    "sensing0",
    "sensing1(n=150)",
    "sensing2(n_words=150)",
    "linear",
    "sensing1(n=150) + linear",
)


_C_SUFFIX = re.compile(r"\[\s*C\s*=\s*([^\]]*)\]\s*$")


def parse_configuration(text: str, dataset: Dataset) -> Configuration:
    """Parse ``"rbf + rigid(1)"``, ``"hog(2, 9): rigid(1)"`` or ``"sensing1 [C=3]"`` (the SVM's
    C, default 1) into canonical form. One ``transform:`` before every measure is the model's
    transform; measures on transforms of their own (``"hog(8): rbf + pixels: rigid(1)"``, more
    than one colon, or a colon after a ``+``) keep theirs.

    Raises
    ------
    SpecError
    """
    C = 1.0
    if match := _C_SUFFIX.search(text):
        try:
            C = float(match.group(1))
        except ValueError:
            raise SpecError(f"C must be a number in {text!r}") from None
        if not (math.isfinite(C) and C > 0):
            raise SpecError(f"C must be positive in {text!r}")
        text = text[: match.start()]
    transform_text, sep, similarities = text.rpartition(":")
    if transform_text.count(":") or "+" in transform_text:
        # Measures on transforms of their own ("hog(8): rbf + pixels: rbf"): no model-wide one.
        transform_text, sep, similarities = "", "", text
    specs = parse_specs(similarities)
    spec = dataset.input_spec
    settled = input_kind_for_data(spec).settle_transforms(
        spec, specs, transform_text if sep else None
    )
    transform = settled[0]
    return Configuration(str(transform), " + ".join(format_spec(s) for s in specs), C)


def run_report(
    dataset: Dataset,
    grid: ReportGrid,
    verbose: bool = True,
    cluster: str | None = None,
    worker_memory: str | None = None,
) -> Report:
    """Train every fit of the grid and the baselines.

    Parameters
    ----------
    dataset : Dataset
    grid : ReportGrid
    verbose : bool
        Progress bars over the grid.
    cluster : str, optional
        Run the cross-validation's fits on this Dask cluster (``local:N`` or an address; see
        :func:`training.cluster.connection.connect`); the final fits stay in this process. None: in
        this process, unless inside ``with distributed.Client(...)``, whose cluster then runs every
        fit (as it does a :class:`BasisExpandingSVC`'s).
    worker_memory : str, optional
        The memory limit of each ``local:N`` worker (see
        :func:`training.cluster.connection.connect`).

    Returns
    -------
    Report
    """
    fits = grid.fits()
    configs = [
        dict(
            similarity=configuration.similarities,
            input_transform=configuration.transform,
            basis_per_class=size,
            basis_strategy=strategy,
            normalization=normalization,
            C=configuration.C,
            min_df=grid.min_df,
            stop_words=grid.stop_words,
            random_state=grid.seed,
        )
        for configuration, size, strategy, normalization in fits
    ]
    with client_for(cluster, worker_memory=worker_memory) as client:
        correct = _validation_correct(dataset, configs, grid.folds, grid.seed, client, verbose)
    records = []
    for (configuration, size, strategy, normalization), config, n_correct in tqdm(
        list(zip(fits, configs, correct, strict=True)),
        desc="report fits",
        unit="fit",
        disable=not verbose,
    ):
        validation_accuracy = n_correct / len(dataset.y_train)
        result = fit_dataset(dataset, "report", **config)
        predictor = result.predictor
        predictor.warm_up()
        records.append(
            FitRecord(
                configuration=configuration,
                basis_per_class=size,
                basis_strategy=strategy,
                normalization=normalization,
                n_basis=predictor.n_basis,
                n_parameters=predictor_parameters(predictor),
                validation_accuracy=validation_accuracy,
                test_accuracy=_accuracy(predictor, dataset),
                train_seconds=result.timings["train_seconds"],
                predict_us_per_sample=1e6
                * median_seconds(
                    lambda p=predictor: p.decision_function(dataset.X_test), grid.repeats
                )
                / len(dataset.y_test),
                diagnostics=predictor.metadata["diagnostics"],
                warnings=result.warnings,
            )
        )
    n_classes = len(dataset.classes)
    if dataset.input_spec.kind == "text":
        baselines = evaluate_text_baselines(
            dataset.X_train,
            dataset.y_train,
            dataset.X_test,
            dataset.y_test,
            fit_vocabulary(dataset.X_train, grid.min_df, grid.stop_words),
            repeats=grid.repeats,
        )
    else:
        baselines = evaluate_baselines(
            dataset.X_train,
            dataset.y_train,
            dataset.X_test,
            dataset.y_test,
            repeats=grid.repeats,
            nystroem_components=tuple(
                size * n_classes
                for size in grid.basis_sizes
                if size * n_classes <= len(dataset.y_train)
            ),
        )
    return Report(
        dataset=dataset.name,
        n_train=len(dataset.y_train),
        n_validation=len(dataset.y_train),
        n_test=len(dataset.y_test),
        n_classes=n_classes,
        grid=grid,
        records=records,
        baselines=baselines,
    )


def _validation_correct(
    dataset: Dataset,
    configs: Sequence[dict],
    n_folds: int,
    seed: int,
    client,
    verbose: bool,
) -> list[int]:
    """For each setting of ``configs``, the training items its fold models classify right
    (each item held out once): in this process (``client`` None), or as tasks on the workers
    of ``client``'s cluster."""
    tasks = [(c, fold) for c in range(len(configs)) for fold in range(n_folds)]
    correct = [0] * len(configs)
    progress = tqdm(total=len(tasks), desc="validation fits", unit="fit", disable=not verbose)
    with progress:
        if client is None:
            for c, fold in tasks:
                correct[c] += _fold_correct(dataset, configs[c], n_folds, seed, fold)
                progress.update()
            return correct
        # One worker thread a task, and its kernels on that thread (workers run a task a core).
        jobs = (
            delayed(_setting_fold_correct)(
                c, dataset, {**configs[c], "n_jobs": 1}, n_folds, seed, fold
            )
            for c, fold in tasks
        )
        with parallel_config(backend="dask", client=client, scatter=[dataset]):
            for c, n_correct in Parallel(n_jobs=-1, return_as="generator_unordered")(jobs):
                correct[c] += n_correct
                progress.update()
    return correct


def _setting_fold_correct(setting: int, *args) -> tuple[int, int]:
    return setting, _fold_correct(*args)


def _fold_correct(dataset: Dataset, config: dict, n_folds: int, seed: int, fold: int) -> int:
    """The items of fold ``fold`` of the training split that a model fitted with ``config`` on
    the other folds classifies right."""
    fit_part, held_out = _folds(dataset, n_folds, seed)[fold]
    predictor = fit_dataset(fit_part, "fold", diagnostics=False, **config).predictor
    return int((predictor.predict(held_out.X_test) == held_out.y_test).sum())


def _folds(dataset: Dataset, n_folds: int, seed: int) -> list[tuple[Dataset, Dataset]]:
    """Stratified folds of the training split: (part to fit on, part held out) pairs."""
    splitter = StratifiedKFold(n_splits=n_folds, shuffle=True, random_state=seed)
    X, y = dataset.X_train, dataset.y_train
    folds = []
    for fit_rows, held_rows in splitter.split(X, y):
        fit_part = dataclasses.replace(dataset, X_train=X[fit_rows], y_train=y[fit_rows])
        held_out = dataclasses.replace(fit_part, X_test=X[held_rows], y_test=y[held_rows])
        folds.append((fit_part, held_out))
    return folds


def _accuracy(predictor, dataset: Dataset) -> float:
    return float((predictor.predict(dataset.X_test) == dataset.y_test).mean())


# -- writing -------------------------------------------------------------------------------


def write_report(report: Report, out: Path, command: str) -> Path:
    """Write ``README.md``, the PNG plots and ``results.json`` into ``out``.

    Returns
    -------
    Path of the Markdown file.
    """
    from training.evaluation import plots  # matplotlib is only needed here

    out.mkdir(parents=True, exist_ok=True)
    figures = plots.write_all(report, out)
    (out / "results.json").write_text(json.dumps(report.to_dict(), indent=2, default=str) + "\n")
    markdown = out / "README.md"
    markdown.write_text(render_markdown(report, figures, command))
    return markdown


def _vocabulary(grid: ReportGrid) -> str:
    """How the report's documents were read, for its opening paragraph."""
    words = "every word" if grid.min_df == 1 else f"the words of at least {grid.min_df} texts"
    words += " of the training split"
    if grid.stop_words is not None:
        words += f" but the {grid.stop_words} stop words"
    elif grid.min_df > 1:
        words += ", stop words kept"
    return f" The vocabulary: {words}."


def _pct(value: float) -> str:
    return f"{100 * value:.2f}%"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def render_markdown(report: Report, figures: dict[str, str], command: str) -> str:
    """The report as Markdown, figures linked by file name."""
    grid = report.grid
    best = report.best()
    svc = next(b for b in report.baselines if b.method.startswith("SVC"))
    # On text the usual reference is tf-idf + LinearSVC; elsewhere the kernel SVM.
    reference = next((b for b in report.baselines if b.method == "tf-idf + LinearSVC"), svc)
    strategy, normalization = grid.strategies[0], grid.normalizations[0]
    lines = [
        f"# BE-SVM report: {report.dataset}",
        "",
        f"Made with `{command}` on {platform.machine()} ({platform.python_version()}).",
        f"{report.n_train:,} training items, {report.n_test:,} test items, "
        f"{report.n_classes} classes. Every setting is scored twice: by stratified "
        f"{grid.folds}-fold cross-validation within the training split (the *validation* "
        "accuracy, which chooses the best), and trained on the whole training split and tested "
        "on the test split (every other accuracy shown). Prediction times are medians over the "
        "whole test set in one batch, on the machine that made the report."
        + (_vocabulary(grid) if reference is not svc else ""),
        "",
        "## Best configuration (by cross-validated accuracy)",
        "",
        f"**{best.configuration.label}**, {best.basis_per_class} bases per class "
        f"(B = {best.n_basis}), basis `{best.basis_strategy}`, normalisation "
        f"`{best.normalization}`: cross-validated {_pct(best.validation_accuracy)}, "
        f"test **{_pct(best.test_accuracy)}** against {reference.method}'s "
        f"{_pct(reference.accuracy)}; {best.predict_us_per_sample:.1f} µs per item against "
        f"{svc.method}'s {svc.predict_us_per_sample:.1f} µs (whole test set in one batch).",
        "",
        "## Baselines "
        + (
            "(the same vocabulary, except where every word is kept)"
            if reference is not svc
            else "(same inputs, normalised the same way)"
        ),
        "",
        *_table(
            ["method", "accuracy", "train s", "predict µs/item", "parameters"],
            [
                [
                    b.method,
                    _pct(b.accuracy),
                    f"{b.train_seconds:.2f}",
                    f"{b.predict_us_per_sample:.1f}",
                    f"{b.n_parameters:,}",
                ]
                for b in report.baselines
            ],
        ),
        "",
        f"## Accuracy against basis size (basis `{strategy}`, normalisation `{normalization}`)",
        "",
        f"![accuracy against basis size]({figures['basis_size']})",
        "",
        *_table(
            ["configuration", *(f"{s}/class" for s in grid.basis_sizes)],
            [
                [
                    c.label,
                    *(
                        _pct(r.test_accuracy)
                        if (r := report.find(c, s, strategy, normalization))
                        else "—"
                        for s in grid.basis_sizes
                    ),
                ]
                for c in grid.configurations
            ],
        ),
        "",
        "## Accuracy against model size",
        "",
        "Parameters are the numbers a model keeps to predict: for BE-SVM the basis items, the "
        "weights and any projection; for SVC the support vectors and their coefficients; for "
        "Nystroem the landmarks and the weights.",
        "",
        f"![accuracy against parameters]({figures['parameters']})",
        "",
        f"## Basis strategies ({grid.reference_size} per class, normalisation `{normalization}`)",
        "",
        *_sweep_table(report, "basis_strategy", grid.strategies, normalization=normalization),
        "",
        f"## Normalisations ({grid.reference_size} per class, basis `{strategy}`)",
        "",
        f"![normalisations]({figures['normalizations']})",
        "",
        *_sweep_table(report, "normalization", grid.normalizations, strategy=strategy),
        "",
        f"## Eigenvalue diagnostics ({grid.reference_size} per class, basis `{strategy}`)",
        "",
        "NgRat is the fraction of negative eigenvalues of the symmetrised basis Gram matrix of a "
        "measure, NgEng the negative eigenvalues' total magnitude over the positive ones' "
        "(BE-SVM paper, table 2). Zero for a kernel; the invariant and sensing measures are "
        "indefinite, which a kernel SVM cannot use and BE-SVM can.",
        "",
        f"![eigenvalue diagnostics]({figures['eigen']})",
        "",
        *_table(
            ["transform", "measure", "NgRat", "NgEng", "smallest eigenvalue", "largest"],
            [
                [
                    transform,
                    name,
                    format_ratio(d["ngrat"]),
                    format_ratio(d["ngeng"]),
                    f"{d['min_eigenvalue']:.3g}",
                    f"{d['max_eigenvalue']:.3g}",
                ]
                for (transform, name), d in diagnostics_by_measure(report).items()
            ],
        ),
        "",
        "## Every fit",
        "",
        *_table(
            [
                "configuration",
                "per class",
                "basis",
                "normalisation",
                "B",
                "cross-validated",
                "test",
                "train s",
                "predict µs/item",
                "parameters",
            ],
            [
                [
                    r.configuration.label,
                    str(r.basis_per_class),
                    r.basis_strategy,
                    r.normalization,
                    str(r.n_basis),
                    _pct(r.validation_accuracy),
                    _pct(r.test_accuracy),
                    f"{r.train_seconds:.2f}",
                    f"{r.predict_us_per_sample:.1f}",
                    f"{r.n_parameters:,}",
                ]
                for r in report.records
            ],
        ),
        "",
        "The numbers are also in `results.json`.",
        "",
    ]
    return "\n".join(lines)


def _sweep_table(report: Report, axis: str, values: Sequence[str], **fixed: str) -> list[str]:
    grid = report.grid
    rows = []
    for configuration in grid.configurations:
        cells = []
        for value in values:
            setting = {
                "basis_strategy": grid.strategies[0],
                "normalization": grid.normalizations[0],
                **fixed,
            }
            setting[axis] = value
            record = report.find(
                configuration,
                grid.reference_size,
                setting["basis_strategy"],
                setting["normalization"],
            )
            cells.append(_pct(record.test_accuracy) if record else "—")
        rows.append([configuration.label, *cells])
    return _table(["configuration", *values], rows)


def build_grid(
    dataset: Dataset,
    configurations: Sequence[str],
    basis_sizes: Sequence[int],
    strategies: Sequence[str],
    normalizations: Sequence[str],
    reference_size: int,
    seed: int,
    repeats: int,
    folds: int = 3,
    min_df: int = DEFAULT_MIN_DF,
    stop_words: str | None = DEFAULT_STOP_WORDS,
) -> ReportGrid:
    """Parse and check the command line's grid before anything is trained.

    Raises
    ------
    SpecError, ValueError
    """
    if not configurations or not basis_sizes or not strategies or not normalizations:
        raise ValueError("every axis of the report grid needs at least one value")
    if any(size < 1 for size in basis_sizes) or reference_size < 1:
        raise ValueError("basis sizes must be positive integers")
    if folds < 2:
        raise ValueError(f"cross-validation needs at least 2 folds, got {folds}")
    unknown = [s for s in strategies if s not in BASIS_STRATEGIES]
    if unknown:
        raise ValueError(f"unknown basis strategy {unknown[0]!r}; known: {BASIS_STRATEGIES}")
    return ReportGrid(
        configurations=tuple(
            dict.fromkeys(parse_configuration(c, dataset) for c in configurations)
        ),
        basis_sizes=tuple(sorted(set(basis_sizes))),
        strategies=tuple(dict.fromkeys(strategies)),
        normalizations=tuple(dict.fromkeys(parse_normalization(n) for n in normalizations)),
        reference_size=reference_size,
        folds=folds,
        seed=seed,
        repeats=repeats,
        min_df=min_df,
        stop_words=stop_words,
    )
