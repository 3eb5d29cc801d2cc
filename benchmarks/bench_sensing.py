"""Cost of the sensing kernels on real text, and of /classify on one text, in the same run.

    .venv/bin/python benchmarks/bench_sensing.py [--repeats 5] [--basis 1000] [--requests 300]
        [--model PATH] [--skip-http] [--dense-docs 20]

Data: Debian's fortunes (``load_dataset("fortunes")``), word counts over a vocabulary fitted on
the training split (the trainer's ``fit_vocabulary``, with :data:`VOCABULARY`); the idf is the
smooth idf of the training counts. The basis is ``--basis`` training documents, evenly spaced
through the training split.

1. Sensing-kernel throughput: ``SimilaritySpec.compute(basis, X)`` on :class:`Documents` for
   ``linear`` (tf-idf, the reference), ``sensing0``, ``sensing1(n=150)`` and
   ``sensing2(n_words=150)``, at two batch sizes: every test document in one call (the parallel
   driver, as ``compute`` picks it) and one document per call (the serial driver; latency per
   document, median over 200 test documents). Every timed call gets a fresh ``Documents``, so
   the input view is paid each time, as when serving: the tf-idf weighting for ``linear`` and,
   for ``sensing2``, resampling every document to 150 words (a numba loop). Two more rows time
   ``linear`` and ``sensing2`` with the view computed beforehand, i.e. the kernel alone. The
   basis postings are built once, before timing, as a loaded model holds them. Each measure is
   called once (compiling it) before it is timed; figures are medians of ``--repeats`` runs.
   The big batch is also timed on the serial driver (one thread), to show what the parallel
   one gains on this machine.

   Baseline: the same ``sensing0`` and ``sensing1`` values computed densely with numpy/scipy
   (``scipy.special.gammaln`` on dense count matrices broadcast over the whole vocabulary, one
   block of rows at a time; ``gammaln(b + 1)`` of the basis precomputed, as the postings hold
   it) on ``--dense-docs`` test documents, since it is slow. Both must agree (``np.allclose``)
   before anything is timed; the run stops otherwise. The speedups printed are dense time /
   numba-sparse time on the same documents, through ``compute`` (which picks the parallel
   driver, every core) and on the serial driver (one thread, like numpy's ``gammaln``).

2. ``POST /classify`` with one short text through a real server: a ``sensing1(n=150)`` model
   (25 basis documents per class) is trained into a temporary directory (or ``--model`` is
   served), ``python -m service.api`` is started on a free local port, and after warm-up requests
   ``--requests`` requests are sent one after another on one persistent httpx client. Baselines
   in the same run: the in-process ``Predictor.classify(texts=[text])`` and scikit-learn's
   ``make_pipeline(TfidfVectorizer(), LinearSVC())`` ``.predict([text])``, trained on the same
   training split. ``--skip-http`` leaves out the server (the two in-process rows remain).

The machine is shared and noisy: compare the ratios, which come from one run, rather than the
absolute figures. Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from scipy.special import gammaln
from serving import latencies, running_server
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.pipeline import make_pipeline
from sklearn.svm import LinearSVC

from service.model import Predictor
from service.model.inputs.words import Documents, canonical_counts, smooth_idf
from service.model.similarity import SimilaritySpec, parse_spec
from service.model.threads import DOCUMENT_PAIR_MULTIPLY_ADDS, SIMILARITY_PARALLEL_MIN_MULTIPLY_ADDS
from training.data.datasets import Dataset, load_dataset
from training.data.readers import DatasetError
from training.estimator.preparation import FREQUENT_WORDS, fit_vocabulary
from training.evaluation.held_out import median_seconds
from training.fitting import fit_dataset

MEASURES = ("linear", "sensing0", "sensing1(n=150)", "sensing2(n_words=150)")
# The vocabulary its figures (docs/measurements/benchmarks.md) were measured with.
VOCABULARY = FREQUENT_WORDS
BATCH1_DOCS = 200
# Elements of one dense block (rows x basis x words): 16M float64 = 128 MB per buffer.
DENSE_BLOCK_ELEMENTS = 16_000_000


# -- part 1: sensing kernels --------------------------------------------------------------------


def _driver(n_rows: int, n_basis: int) -> str:
    """The driver ``SimilaritySpec.compute`` picks for documents (same rule)."""
    work = n_rows * n_basis * DOCUMENT_PAIR_MULTIPLY_ADDS
    return "serial" if work < SIMILARITY_PARALLEL_MIN_MULTIPLY_ADDS else "parallel"


def _compute(spec: SimilaritySpec, serial: bool) -> Callable[..., np.ndarray]:
    """``spec.compute(basis, X, out)``, or the same forced onto the serial driver (the calling
    thread) through the measure's serial documents driver."""
    if not serial:
        return spec.compute
    args = [
        int(value) if p.integer else value
        for p, (_, value) in zip(spec.kind.parameters, spec.params, strict=True)
    ]

    def serial_compute(basis: Documents, X: Documents, out: np.ndarray) -> np.ndarray:
        spec.kind.documents.serial(basis, X, *args, out)
        return out

    return serial_compute


def _batch_seconds(
    spec: SimilaritySpec,
    basis: Documents,
    counts: sp.csr_matrix,
    idf,
    repeats: int,
    *,
    cached: bool = False,
    serial: bool = False,
) -> float:
    """Median of one call on the whole batch, with a fresh Documents a call unless ``cached``
    (then the view is computed before timing); the driver ``compute`` picks, or the serial one."""
    out = np.empty((counts.shape[0], basis.shape[0]))
    compute = _compute(spec, serial)
    if cached:
        docs = Documents(counts, idf)
        return median_seconds(lambda: compute(basis, docs, out), repeats)
    return median_seconds(lambda: compute(basis, Documents(counts, idf), out), repeats)


def _batch1_seconds(
    spec: SimilaritySpec, basis: Documents, rows: list[sp.csr_matrix], idf, repeats: int
) -> float:
    """Median over documents of each document's median latency (one fresh Documents a call)."""
    out = np.empty((1, basis.shape[0]))
    per_doc = [[] for _ in rows]
    for _ in range(repeats):
        for times, row in zip(per_doc, rows, strict=True):
            X = Documents(row, idf)
            started = time.perf_counter()
            spec.compute(basis, X, out)
            times.append(time.perf_counter() - started)
    return statistics.median(statistics.median(times) for times in per_doc)


def _cached_batch1_seconds(
    spec: SimilaritySpec, basis: Documents, rows: list[sp.csr_matrix], idf, repeats: int
) -> float:
    """Like :func:`_batch1_seconds` with each document's view computed before timing."""
    out = np.empty((1, basis.shape[0]))
    docs = [Documents(row, idf) for row in rows]
    return statistics.median(
        median_seconds(lambda d=d: spec.compute(basis, d, out), repeats) for d in docs
    )


def _dense_block_rows(n_basis: int, n_words: int) -> int:
    return max(1, DENSE_BLOCK_ELEMENTS // (n_basis * n_words))


def _dense_overlaps(B: np.ndarray, lgamma_b1: np.ndarray, X: np.ndarray) -> np.ndarray:
    r"""``sum_w [lgamma(b_w + x_w + 1) - lgamma(b_w + 1) - lgamma(x_w + 1)]`` of every pair,
    densely over all W words, in blocks of rows. Shape (n, n_basis)."""
    n_basis, n_words = B.shape
    out = np.empty((X.shape[0], n_basis))
    step = _dense_block_rows(n_basis, n_words)
    lgamma_x1 = gammaln(X + 1.0)
    for start in range(0, X.shape[0], step):
        x = X[start : start + step, np.newaxis, :]
        block = x + B[np.newaxis]
        block += 1.0
        gammaln(block, out=block)
        block -= lgamma_b1[np.newaxis]
        block -= lgamma_x1[start : start + step, np.newaxis, :]
        out[start : start + step] = block.sum(axis=2)
    return out


class DenseBaseline:
    """Dense numpy/scipy sensing0 and sensing1 of count matrices against a fixed basis."""

    def __init__(self, basis_counts: sp.csr_matrix, n: float):
        self.n = n
        self.counts = basis_counts.toarray()
        self.totals = self.counts.sum(axis=1)
        self.lgamma_counts1 = gammaln(self.counts + 1.0)
        self.scaled = self._scaled(self.counts, n)
        self.lgamma_scaled1 = gammaln(self.scaled + 1.0)

    @staticmethod
    def _scaled(counts: np.ndarray, n: float) -> np.ndarray:
        totals = counts.sum(axis=1, keepdims=True)
        return counts * (n / np.where(totals > 0, totals, 1.0))

    def sensing0(self, X_counts: sp.csr_matrix) -> np.ndarray:
        X = X_counts.toarray()
        n_words = X.shape[1]
        totals_x = X.sum(axis=1)[:, np.newaxis]
        totals_b = self.totals[np.newaxis, :]
        out = _dense_overlaps(self.counts, self.lgamma_counts1, X)
        out += gammaln(totals_b + 1.0) + gammaln(totals_x + 1.0)
        out -= gammaln(totals_b + totals_x + n_words)
        return out

    def sensing1(self, X_counts: sp.csr_matrix) -> np.ndarray:
        X = self._scaled(X_counts.toarray(), self.n)
        return _dense_overlaps(self.scaled, self.lgamma_scaled1, X)


def _check_agreement(name: str, sparse: np.ndarray, dense: np.ndarray) -> float:
    difference = float(np.max(np.abs(sparse - dense)))
    if not np.allclose(sparse, dense, rtol=1e-7, atol=1e-7):
        worst = np.unravel_index(np.argmax(np.abs(sparse - dense)), sparse.shape)
        raise SystemExit(
            f"{name}: numba-sparse and dense numpy disagree: max |difference| {difference:.3g} "
            f"at (doc, basis) {tuple(int(i) for i in worst)}: sparse {sparse[worst]!r}, "
            f"dense {dense[worst]!r}"
        )
    return difference


def _evenly_spaced(n: int, k: int) -> np.ndarray:
    return np.unique(np.linspace(0, n - 1, min(k, n)).round().astype(int))


def bench_kernels(data: Dataset, n_basis: int, repeats: int, dense_docs: int) -> None:
    vocabulary = fit_vocabulary(data.X_train, **VOCABULARY)
    train_counts = vocabulary.encode(data.X_train)
    test_counts = canonical_counts(vocabulary.encode(data.X_test))
    idf = smooth_idf(train_counts)
    basis_counts = canonical_counts(train_counts[_evenly_spaced(train_counts.shape[0], n_basis)])
    basis = Documents(basis_counts, idf)
    n_test, n_basis = test_counts.shape[0], basis_counts.shape[0]
    test_totals = np.asarray(test_counts.sum(axis=1)).ravel()
    basis_totals = np.asarray(basis_counts.sum(axis=1)).ravel()
    single_at = _evenly_spaced(n_test, BATCH1_DOCS)
    singles = [canonical_counts(test_counts[i : i + 1]) for i in single_at]

    print(
        f"sensing kernels: vocabulary of {vocabulary.size:,} words fitted on "
        f"{train_counts.shape[0]:,} training docs; basis {n_basis:,} training docs "
        f"(evenly spaced), word totals mean {basis_totals.mean():.1f}, "
        f"median {np.median(basis_totals):.0f}"
    )
    print(
        f"test docs: {n_test:,}, word totals (known words) mean {test_totals.mean():.1f}, "
        f"median {np.median(test_totals):.0f}, {int((test_totals == 0).sum())} empty; "
        f"batch 1: {len(singles)} evenly spaced test docs, one per call"
    )
    print(
        "every timed call gets a fresh Documents: its input view is computed in the call "
        "(tf-idf for linear; for sensing2 the per-document resampling to 150 words)"
    )

    specs = [parse_spec(text) for text in MEASURES]
    rows: list[tuple[str, SimilaritySpec, bool]] = [(str(s), s, False) for s in specs]
    rows += [("linear (view cached)", specs[0], True), ("sensing2 (view cached)", specs[3], True)]
    out = np.empty((n_test, n_basis))
    for spec in specs:  # compile (or load) both drivers and build the basis postings
        spec.compute(basis, Documents(test_counts, idf), out)
        spec.compute(basis, Documents(singles[0], idf))

    print(
        f"\n{'measure':<24} {'batch ' + format(n_test, ','):>11} {'Msim/s':>7} {'x linear':>9} "
        f"{'serial':>9} {'par.':>6} {'batch 1':>9} {'Msim/s':>7} {'x linear':>9} {'b1/batch':>9}"
    )
    print(
        f"{'':<24} {'ms/call':>11} {'':>7} {'':>9} {'ms/call':>9} {'gain':>6} {'µs/doc':>9} "
        f"{'':>7} {'':>9} {'per doc':>9}"
    )
    print(
        f"{'(driver)':<24} {_driver(n_test, n_basis):>11} {'':>7} {'':>9} {'serial':>9} {'':>6} "
        f"{_driver(1, n_basis):>9}"
    )
    reference = None
    for label, spec, cached in rows:
        batch = _batch_seconds(spec, basis, test_counts, idf, repeats, cached=cached)
        serial = _batch_seconds(spec, basis, test_counts, idf, repeats, cached=cached, serial=True)
        if cached:
            single = _cached_batch1_seconds(spec, basis, singles, idf, repeats)
        else:
            single = _batch1_seconds(spec, basis, singles, idf, repeats)
        batch_rate = n_test * n_basis / batch
        single_rate = n_basis / single
        if reference is None:
            reference = (batch_rate, single_rate)
        print(
            f"{label:<24} {1e3 * batch:>11.2f} {batch_rate / 1e6:>7.1f} "
            f"{batch_rate / reference[0]:>9.3f} {1e3 * serial:>9.2f} {serial / batch:>6.2f} "
            f"{1e6 * single:>9.1f} {single_rate / 1e6:>7.2f} {single_rate / reference[1]:>9.3f} "
            f"{single / (batch / n_test):>9.1f}"
        )
    print(
        "Msim/s: million similarities per second; x linear: throughput relative to the linear "
        "row (below 1: slower);\npar. gain: serial driver time / parallel driver time on the "
        "big batch; b1/batch per doc: batch-1 latency / per-doc cost in the big batch"
    )

    dense_at = _evenly_spaced(n_test, dense_docs)
    subset = canonical_counts(test_counts[dense_at])
    n = dict(specs[2].params)["n"]
    dense = DenseBaseline(basis_counts, n)
    subset_totals = np.asarray(subset.sum(axis=1)).ravel()
    print(
        f"\ndense numpy/scipy baseline: {len(dense_at)} evenly spaced test docs (word totals mean "
        f"{subset_totals.mean():.1f}) x {n_basis:,} basis docs, gammaln over all "
        f"{vocabulary.size:,} words in blocks of {_dense_block_rows(n_basis, vocabulary.size)} "
        "row(s); numba-sparse on the same docs"
    )
    print(
        f"{'measure':<24} {'sparse ms':>10} {'serial ms':>10} {'dense ms':>10} "
        f"{'dense/sparse':>13} {'dense/serial':>13} {'max |diff|':>11}"
    )
    for spec, dense_run in ((specs[1], dense.sensing0), (specs[2], dense.sensing1)):
        sparse_out = spec.compute(basis, Documents(subset, idf))
        serial_out = _compute(spec, serial=True)(basis, Documents(subset, idf), sparse_out.copy())
        dense_out = dense_run(subset)  # also the dense warm-up
        difference = _check_agreement(str(spec), sparse_out, dense_out)
        _check_agreement(f"{spec} (serial driver)", serial_out, dense_out)
        sparse_time = _batch_seconds(spec, basis, subset, idf, repeats)
        serial_time = _batch_seconds(spec, basis, subset, idf, repeats, serial=True)
        dense_time = median_seconds(lambda run=dense_run: run(subset), repeats, warm_up=False)
        print(
            f"{spec!s:<24} {1e3 * sparse_time:>10.3f} {1e3 * serial_time:>10.3f} "
            f"{1e3 * dense_time:>10.1f} {dense_time / sparse_time:>13.0f} "
            f"{dense_time / serial_time:>13.0f} {difference:>11.2g}"
        )
    print(
        f"sparse: compute() ({_driver(len(dense_at), n_basis)} driver here); serial: the serial "
        "driver, one thread like numpy's gammaln"
    )


# -- part 2: /classify --------------------------------------------------------------------------


def _http_latencies(model: Path, text: str, top_k: int, requests: int) -> np.ndarray:
    with running_server(model) as client:
        body = {"texts": [text], "top_k": top_k}
        client.post("/classify", json=body).raise_for_status()

        def post() -> None:
            client.post("/classify", json=body).raise_for_status()

        return latencies(post, requests)


def _short_quote(data: Dataset, predictor: Predictor) -> str:
    """The first test quote of one line, at most 80 characters, with 5 to 10 known words."""
    for text in data.X_test:
        if "\n" in text or len(text) > 80:
            continue
        if 5 <= predictor.encode_texts([text]).known_words()[0] <= 10:
            return text
    return str(data.X_test[0])


def bench_classify(data: Dataset, model: Path | None, requests: int, skip_http: bool) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-sensing-") as tmp:
        if model is None:
            started = time.perf_counter()
            config = dict(similarity="sensing1(n=150)", basis_per_class=25, **VOCABULARY)
            predictor = fit_dataset(data, "fortunes-sensing1-bench", **config).predictor
            model = Path(tmp) / "model"
            predictor.save(model)
            trained = f"trained in {time.perf_counter() - started:.1f} s into a temporary dir"
        else:
            predictor = Predictor.load(model)
            trained = f"loaded from {model}"
        if predictor.vocabulary is None:
            raise SystemExit(f"{model}: the model has no vocabulary, so it cannot read texts")
        predictor.warm_up()
        text = _short_quote(data, predictor)
        known = int(predictor.encode_texts([text]).known_words()[0])
        sklearn_model = make_pipeline(TfidfVectorizer(), LinearSVC())
        sklearn_model.fit(list(data.X_train), data.y_train)

        print(
            f"\n/classify: model {predictor.name} ({trained}): "
            f"{' + '.join(predictor.similarity_names)}, B={predictor.n_basis}, "
            f"{len(predictor.classes)} classes"
        )
        print(f"text ({known} known words): {text!r}, top_k 3")
        timings = {
            "in-process Predictor.classify": latencies(
                lambda: predictor.classify(texts=[text], top_k=3), requests
            ),
            "sklearn tf-idf + LinearSVC .predict": latencies(
                lambda: sklearn_model.predict([text]), requests
            ),
        }
        if not skip_http:
            timings = {
                f"HTTP POST /classify ({requests})": _http_latencies(model, text, 3, requests),
                **timings,
            }
    print(f"{'path':<38} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8}")
    for label, times in timings.items():
        p50, p90, p99 = 1e3 * np.percentile(times, [50, 90, 99])
        print(f"{label:<38} {p50:>8.3f} {p90:>8.3f} {p99:>8.3f}")
    medians = [float(np.median(times)) for times in timings.values()]
    if not skip_http:
        print(f"HTTP / in-process (p50): {medians[0] / medians[1]:.1f}")
    print(f"in-process / sklearn (p50): {medians[-2] / medians[-1]:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per figure (median)")
    parser.add_argument("--basis", type=int, default=1000, help="basis size for the kernels")
    parser.add_argument("--requests", type=int, default=300, help="timed /classify requests")
    parser.add_argument("--model", type=Path, help="serve this text model instead of training one")
    parser.add_argument("--skip-http", action="store_true", help="do not start the server")
    parser.add_argument(
        "--dense-docs", type=int, default=20, help="test docs for the (slow) dense baseline"
    )
    args = parser.parse_args()
    if min(args.repeats, args.basis, args.requests, args.dense_docs) < 1:
        parser.error("--repeats, --basis, --requests and --dense-docs must be at least 1")

    started = time.perf_counter()
    try:
        data = load_dataset("fortunes")
    except DatasetError as error:
        raise SystemExit(f"bench_sensing needs the fortunes data set: {error}") from None
    print(
        f"fortunes: {len(data.X_train):,} training and {len(data.X_test):,} test quotes, "
        f"{len(data.classes)} classes; repeats {args.repeats}; {os.cpu_count()} CPUs"
    )
    bench_kernels(data, args.basis, args.repeats, args.dense_docs)
    bench_classify(data, args.model, args.requests, args.skip_http)
    print(f"\nwall time {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
