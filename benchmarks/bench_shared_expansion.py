"""A path of C on one expansion against a fit per C (issue 34 item 3: features computed once).

    .venv/bin/python benchmarks/bench_shared_expansion.py --set spambase --seed 0 \\
        --similarity "rbf(gamma=0.25)" --input-normalization per-feature \\
        --normalization "besvm,nystroem(clip)" --C 100,10 --basis-per-class 3000

For each normalisation, a :class:`~training.BasisExpandingSVC` is fitted on the set's training
split (as ``bench_defaults.py`` splits it) at every C of ``--C`` twice: with ``fit`` for each C
(an expansion each, what the basis ladder's search did before), with one ``expand`` and a
``fit_expanded`` for each C (what it does now), and the same with each C's solver started from
the C before's model (``fit_expanded(start=...)``). Printed: the CPU seconds of each way (the
median of ``--repeats`` runs; the process's CPU time, so that other load on the machine counts
less), the speed-ups, and the largest difference between the ways' test scores (the same
models: zero up to the solver's tolerance).
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import numpy as np
from sklearn.exceptions import ConvergenceWarning

from training import BasisExpandingSVC
from training.data.datasets import load_dataset


def _cpu(work):
    started = time.process_time()
    result = work()
    return time.process_time() - started, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--set", default="spambase")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--similarity", default="rbf(gamma=0.25)")
    parser.add_argument("--input-normalization", default="per-feature")
    parser.add_argument("--normalization", default="besvm,nystroem(clip)")
    parser.add_argument("--C", default="100,10", help="comma separated")
    parser.add_argument("--basis-per-class", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--n-jobs", type=int, default=1)
    args = parser.parse_args()
    data = load_dataset(args.set, test_fraction=0.25, seed=args.seed)
    Cs = [float(value) for value in args.C.split(",")]
    warnings.simplefilter("ignore", ConvergenceWarning)
    print(
        f"{args.set} seed {args.seed}, {len(data.y_train)} training items, {args.similarity}, "
        f"{args.input_normalization}, {args.basis_per_class} a class, C {args.C}, "
        f"{args.n_jobs} thread(s), median of {args.repeats}"
    )
    print(
        "normalization | fit per C, CPU s | one expansion, CPU s (speed-up) | and warm starts "
        "(speed-up) | largest score difference"
    )
    for normalization in args.normalization.split(","):
        params = {
            "similarity": args.similarity,
            "input_normalization": args.input_normalization,
            "normalization": normalization,
            "basis_per_class": args.basis_per_class,
            "n_jobs": args.n_jobs,
        }

        def each(params=params):
            return [BasisExpandingSVC(**params, C=C).fit(data.X_train, data.y_train) for C in Cs]

        def shared(params=params, warm=False):
            expanded = BasisExpandingSVC(**params).expand(data.X_train, data.y_train)
            models = []
            for C in Cs:
                start = models[-1] if warm and models else None
                model = BasisExpandingSVC(**params, C=C)
                models.append(model.fit_expanded(expanded, start=start))
            return models

        separate, together, warmed = [], [], []
        for _ in range(args.repeats):
            seconds, models = _cpu(each)
            separate.append(seconds)
            seconds, reused = _cpu(shared)
            together.append(seconds)
            seconds, started = _cpu(lambda shared=shared: shared(warm=True))
            warmed.append(seconds)
        test = data.X_test
        difference = max(
            float(np.abs(a.decision_function(test) - b.decision_function(test)).max())
            for other in (reused, started)
            for a, b in zip(models, other, strict=True)
        )
        accuracies = ", ".join(
            f"{100 * model.score(data.X_test, data.y_test):.2f}%" for model in reused
        )
        a, b, c = (statistics.median(times) for times in (separate, together, warmed))
        print(
            f"{normalization} | {a:.2f} | {b:.2f} ({a / b:.2f}x) | {c:.2f} ({a / c:.2f}x)", end=""
        )
        print(f" | {difference:.1e} (test: {accuracies})")


if __name__ == "__main__":
    main()
