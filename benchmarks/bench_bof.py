"""The bof transform on the glyph images: a table like the sensing-kernel paper's Table 3.

    .venv/bin/python benchmarks/bench_bof.py --data data/glyphs.npz [--out
    docs/measurements/reports/glyphs]
        [--basis-per-class 100] [--words 400] [--n-jobs 2] [--repeats 3] [--svc-grid small]

(``make glyph-fonts glyphs report-glyphs``.) The glyph images (``python -m training
build-glyphs``): letters A-J from installed fonts, 64 x 64, 100 training fonts per letter, up
to 200 other fonts per letter for the test, as the paper's 100 training images per class.

Rows, BE-SVM (``training.fitting.fit_dataset``, ``--basis-per-class`` items of each class as the
basis, normalisation ``auto``, C = 1) with the bof transform (16 x 16 patches every 8 pixels,
``--words`` visual words) under each measure and each of the paper's three settings:
``L = 0, single`` (``bof(levels=0)``: the whole image one bag), ``L = 2, single``
(``bof(levels=2, single=1)``: 16 cells) and ``L = 2, pyramid`` (``bof(levels=2)``: 21 cells,
Lazebnik's weights 1/4, 1/4, 1/2). Measures: ``sensing0``, ``sensing1(n=150)``,
``sensing2(n_words=500)`` (the paper's N = 500 for images), tf-idf ``linear``. The parameters
are the paper's or ours by default; none is tuned here (the paper tunes n by 5-fold CV).

Baselines in the same run: BE-SVM ``hog(8): rbf`` (HOG cells of 8 pixels, 8 x 8 x 9 numbers),
and scikit-learn's ``SVC(RBF)`` with C and gamma (and a ``StandardScaler`` or not) chosen by
5-fold ``GridSearchCV`` on the training split, on the pixels and on the same HOG cells.

Columns: test accuracy; training seconds (everything ``fit`` does: for bof the descriptors, the
k-means vocabulary and the words of every training image; for the SVC the grid search); and
prediction milliseconds per image, the median of ``--repeats`` runs on the whole test split in
one batch (the service's ``Predictor.decision_function``: raw images in, bof computed), with
every core the run may use. The machine is shared: the load average is printed with the table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from service.model.inputs.transforms import parse_transform
from service.model.threads import limit_threads
from training.data.datasets import Dataset, load_dataset
from training.evaluation.held_out import median_seconds, tuned_svc
from training.fitting import fit_dataset

MEASURES = ("sensing0", "sensing1(n=150)", "sensing2(n_words=500)", "linear")
SETTINGS = {
    "L = 0, single": "levels=0",
    "L = 2, single": "levels=2, single=1",
    "L = 2, pyramid": "levels=2",
}
HOG = "hog(cell_size=8, orientations=9)"


def _besvm(dataset: Dataset, similarity: str, args) -> dict:
    started = time.perf_counter()
    result = fit_dataset(
        dataset,
        "glyphs",
        diagnostics=False,
        similarity=similarity,
        basis_per_class=args.basis_per_class,
        n_jobs=args.n_jobs,
    )
    seconds = time.perf_counter() - started
    predictor = result.predictor
    predictor.warm_up()
    with limit_threads(numba_threads=args.n_jobs, blas_threads=args.n_jobs):
        accuracy = float(np.mean(predictor.predict(dataset.X_test) == dataset.y_test))
        predict = median_seconds(lambda: predictor.decision_function(dataset.X_test), args.repeats)
    return {
        "similarity": similarity,
        "accuracy": accuracy,
        "train_seconds": seconds,
        "predict_ms": 1e3 * predict / len(dataset.y_test),
        "normalization": predictor.normalization,
    }


def _hog_cells(dataset: Dataset, X: np.ndarray) -> np.ndarray:
    return parse_transform(HOG).apply(X, dataset.input_spec)


def _svc(dataset: Dataset, features, name: str, args) -> dict:
    search = tuned_svc(documents=False, grid=args.svc_grid, n_jobs=args.n_jobs)
    started = time.perf_counter()
    search.fit(features(dataset.X_train), dataset.y_train)
    seconds = time.perf_counter() - started
    model = search.best_estimator_
    accuracy = float(np.mean(model.predict(features(dataset.X_test)) == dataset.y_test))
    predict = median_seconds(lambda: model.predict(features(dataset.X_test)), args.repeats)
    best = search.best_params_
    return {
        "similarity": name,
        "accuracy": accuracy,
        "train_seconds": seconds,
        "predict_ms": 1e3 * predict / len(dataset.y_test),
        "normalization": (
            f"{'scaled' if best['scale'] != 'passthrough' else 'raw'}, C {best['svc__C']:g}, "
            f"gamma {best['svc__gamma']}, {model[-1].support_vectors_.shape[0]} SVs"
        ),
    }


def _cell(record: dict) -> str:
    return (
        f"{100 * record['accuracy']:.1f} ({record['train_seconds']:.0f} s, "
        f"{record['predict_ms']:.2f} ms)"
    )


def _markdown(records: dict, baselines: list[dict], dataset: Dataset, args, load) -> str:
    lines = [
        "# The bof transform on the glyph images (a table like the sensing-kernel paper's Table 3)",
        "",
        f"`{' '.join(args.command)}`; {len(dataset.y_train)} training and "
        f"{len(dataset.y_test)} test images of {len(dataset.classes)} letters, 64 x 64, split "
        f"by font; {args.basis_per_class} basis items per class (BE-SVM), {args.words} visual "
        f"words, 16 x 16 patches every 8 pixels; {args.n_jobs} threads; load average before "
        f"and after: {load[0]:.1f}, {load[1]:.1f} (2 cores, shared).",
        "",
        "Test accuracy % (training seconds, prediction ms per image in a batch of the test set):",
        "",
        "| measure | " + " | ".join(SETTINGS) + " |",
        "|---|" + "---|" * len(SETTINGS),
    ]
    for measure in dict.fromkeys(m for m, _ in records):
        cells = [_cell(records[(measure, setting)]) for setting in SETTINGS]
        lines.append(f"| BE-SVM {measure} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Baselines on the same split:",
        "",
        "| method | test accuracy % | training s | prediction ms/image | notes |",
        "|---|---|---|---|---|",
    ]
    for record in baselines:
        lines.append(
            f"| {record['similarity']} | {100 * record['accuracy']:.1f} | "
            f"{record['train_seconds']:.1f} | {record['predict_ms']:.2f} | "
            f"{record['normalization']} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=Path("data/glyphs.npz"))
    parser.add_argument("--out", type=Path, help="write README.md and results.json here")
    parser.add_argument("--basis-per-class", type=int, default=100)
    parser.add_argument("--words", type=int, default=400)
    parser.add_argument("--n-jobs", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--svc-grid", choices=("full", "small"), default="full")
    parser.add_argument("--measures", help="comma separated subset of the measures")
    args = parser.parse_args()
    args.command = ["benchmarks/bench_bof.py", *sys.argv[1:]]
    dataset = load_dataset(str(args.data))
    measures = args.measures.split(",") if args.measures else MEASURES
    load_before = os.getloadavg()[0]
    records = {}
    for setting, levels in SETTINGS.items():
        for measure in measures:
            similarity = f"bof(words={args.words}, {levels}): {measure}"
            records[(measure, setting)] = record = _besvm(dataset, similarity, args)
            print(f"{setting:15} {measure:24} {_cell(record)}", flush=True)
    baselines = [_besvm(dataset, f"{HOG}: rbf", args)]
    baselines[0]["similarity"] = f"BE-SVM {HOG}: rbf"
    for name, features in (
        ("SVC(RBF) tuned by 5-fold CV, pixels", lambda X: X),
        (f"SVC(RBF) tuned by 5-fold CV, {HOG}", lambda X: _hog_cells(dataset, X)),
    ):
        baselines.append(_svc(dataset, features, name, args))
        print(baselines[-1], flush=True)
    load = (load_before, os.getloadavg()[0])
    text = _markdown(records, baselines, dataset, args, load)
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "README.md").write_text(text)
        results = {
            "records": [{"measure": m, "setting": s, **r} for (m, s), r in records.items()],
            "baselines": baselines,
            "load_average": load,
        }
        (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
