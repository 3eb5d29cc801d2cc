"""Thread settings of the numba kernels, BLAS and OpenMP, in one place.

Everything that decides how many threads a computation uses, and at what priority, lives here:
the lock that serialises numba's parallel regions, the fastmath flags the kernels are compiled
with, the work thresholds below which a call stays on the calling thread, the two helpers that
change thread counts (:func:`limit_threads`, which always restores what it changed, and
:func:`configure_worker_threads`, which only computes a count), and the work threads' priority
(:func:`lower_priority`). Nothing else in the code base changes a thread count globally.

numba's thread count (:func:`numba.set_num_threads`) is *per Python thread*: a thread that never
set it uses :data:`numba.config.NUMBA_NUM_THREADS`. So set it in the thread that calls the
kernels (a request handler's, say), not once at start-up. BLAS limits (threadpoolctl) are per
process.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress

import joblib
import numba
from threadpoolctl import threadpool_limits

# numba's workqueue threading layer aborts the process when two threads enter parallel regions at
# once; serving runs handlers on a thread pool, so every parallel driver call (similarity and
# search) goes through this lock. The drivers already use every core, so serialising them costs
# no throughput.
PARALLEL_REGION = threading.Lock()

# Let LLVM reorder the float64 sums so it can vectorise them (several times faster on the rbf
# driver); no flag that assumes finite values: inputs are validated, but a kernel must not rely
# on it.
# numba takes a set (not a frozenset) and keeps the object: never mutate it.
FASTMATH = {"reassoc", "contract"}

# The similarity drivers (SimilaritySpec.compute): below this many multiply-adds
# (n_samples * n_basis * n_features * the measure's cost factor) a call runs on the calling
# thread: a parallel region costs tens of microseconds to start, and far more when another
# process holds a core. rbf on 250 bases of 64 features: batches of up to 12 items run serially;
# rigid(1) (cost 9): one item. Counted in arithmetic because these kernels are compute-bound.
# The bof transform's nearest-word search counts against the same threshold (patches x words x
# 128 per image: one 64 x 64 image at the defaults is 2.5 million, so every bof batch is heavy
# work, and two images or more run in parallel).
SIMILARITY_PARALLEL_MIN_MULTIPLY_ADDS = 200_000

# Batches of at least this many inputs go through a measure's BLAS driver (linear and rbf as
# one matrix product, see service.model.kernels.dense) rather than the serial pair kernels; below it
# numpy's per-call overheads cost more than the product saves. Work above the parallel threshold
# still runs in numba's parallel drivers when at least SIMILARITY_PARALLEL_MIN_THREADS_OVER_BLAS
# numba threads share it: BLAS on one thread is two to three times as fast as a pair kernel
# thread (docs/measurements/benchmarks.md#prediction-and-kernels-make-bench), so two threads
# only tie.
SIMILARITY_BLAS_MIN_SAMPLES = 16
SIMILARITY_PARALLEL_MIN_THREADS_OVER_BLAS = 3

# Batches of fewer inputs than this, and of fewer multiply-adds (n_samples * columns * classes)
# than the second, are scored (similarities times weights) by the compiled loop of
# service.model.kernels.scores, others by BLAS: for one digit the loop saves numpy's dispatch and
# BLAS's entry, run cold between requests, which cost more than the arithmetic; past a few
# hundred thousand multiply-adds BLAS's blocking wins.
SCORES_BLAS_MIN_SAMPLES = 16
SCORES_BLAS_MIN_MULTIPLY_ADDS = 200_000

# A large batch is scored in blocks of this many rows where a block's similarities (of the
# measures computed: a dense `linear` is folded into weights on the input) take at most the
# second bound: each block's similarities are exponentiated and scored while they are in the
# core's cache (2 MiB of L2 here), where the whole batch's passes over them went to memory. On
# one thread, 1,000 items of breast cancer's model (426 similarities each, 852 KiB a block) and
# of digits' (250) took 0.88 and 0.91 times as long as in one block; 128 and 512 rows were
# slower, and so were blocks of 1,000 similarities an item (2 MB a block: 1.03 to 1.08), which
# the bound leaves whole (docs/measurements/benchmarks.md#scores-in-blocks-of-rows-and-the-basis-
# items-in-use, benchmarks/bench_score_blocks.py).
SCORES_BLOCK_ROWS = 256
SCORES_BLOCK_MAX_BYTES = 1 << 20

# The multiply-adds one document pair counts for in that choice: the row kernels' fixed cost per
# basis item plus a few shared words, each costing a log-Gamma (about ten multiply-adds).
DOCUMENT_PAIR_MULTIPLY_ADDS = 32

# The HOG transform (service.model.kernels.hog, BoundTransform.apply): below this many pixel
# values (n_samples * height * width * channels) a batch runs on the calling thread. A grey pixel
# costs one atan2 and one hypot (colour adds a hypot per channel), so this is 32 digits of 8 x 8,
# about a hundred microseconds of work, where a parallel region's start (tens of microseconds
# idle, far more when another process holds a core) is small beside it
# (docs/measurements/benchmarks.md#the-kernels-thresholds-measured).
HOG_PARALLEL_MIN_VALUES = 2_048

# The /search kernel (search_top_k): at or above this many catalogue entries read
# (max(nnz, 1) * N, float32 each) a search runs in parallel, else on the calling thread. Counted
# in entries read, not arithmetic, because the search is bound by memory bandwidth (one
# multiply-add per entry read), which is also why it differs from the similarity threshold.
# On idle cores parallel breaks even near half this; the threshold sits above break-even
# because a parallel region is far slower when another process holds a core, where the serial
# driver only shares its own (docs/measurements/benchmarks.md#the-kernels-thresholds-measured).
SEARCH_PARALLEL_MIN_ENTRIES = 500_000


# How much lower the scheduling priority (nice value) of the server's work threads (model work,
# decoding, loading) is than that of its event loop, which answers every connection, the probes
# included: the loop runs first whenever both want a core, so the server's own work never keeps
# it waiting. +10 weighs a thread about a tenth of one at +0 (Linux's CFS).
WORKER_NICENESS = 10


def lower_priority() -> None:
    """Run the calling thread :data:`WORKER_NICENESS` below the priority it has (Linux, where
    a nice value is a thread's own; threads it starts inherit it); elsewhere nothing. A
    thread may always lower its own priority; a failure (a platform without per-thread nice)
    changes nothing."""
    if sys.platform != "linux":
        return
    thread = threading.get_native_id()
    with suppress(OSError):
        niceness = os.getpriority(os.PRIO_PROCESS, thread) + WORKER_NICENESS
        os.setpriority(os.PRIO_PROCESS, thread, niceness)


def _check_count(value: int | None, what: str) -> None:
    if value is not None and (isinstance(value, bool) or int(value) != value or value < 1):
        raise ValueError(f"{what} must be a positive integer or None, got {value!r}")


@contextmanager
def limit_threads(
    numba_threads: int | None = None,
    blas_threads: int | None = None,
    openmp_threads: int | None = None,
) -> Iterator[None]:
    """Use at most this many numba, BLAS and OpenMP threads inside the ``with`` block, then
    restore them.

    Parameters
    ----------
    numba_threads : int or None
        numba's thread count for the calling thread (:func:`numba.set_num_threads`), capped at
        :data:`numba.config.NUMBA_NUM_THREADS` (the threads numba launched; it refuses more).
        None leaves it as it is. The count before the block is restored on exit, exception or
        not.
    blas_threads : int or None
        Threads of every BLAS library loaded in the process (threadpoolctl), restored on exit.
        None leaves them as they are.
    openmp_threads : int or None
        Threads of the OpenMP runtimes' next parallel regions started from the calling thread
        (threadpoolctl; scikit-learn's k-means runs them), restored on exit. numba's ``omp``
        layer sizes its regions itself: ``numba_threads`` decides those. None leaves them as
        they are.

    Raises
    ------
    ValueError
        If a count is given and is not a positive integer (nothing is changed then).

    Examples
    --------
    >>> with limit_threads(numba_threads=1, blas_threads=1):
    ...     pass  # kernels here run on one thread
    """
    _check_count(numba_threads, "numba_threads")
    _check_count(blas_threads, "blas_threads")
    _check_count(openmp_threads, "openmp_threads")
    with ExitStack() as stack:
        if blas_threads is not None:
            stack.enter_context(threadpool_limits(limits=int(blas_threads), user_api="blas"))
        if openmp_threads is not None:
            stack.enter_context(threadpool_limits(limits=int(openmp_threads), user_api="openmp"))
        if numba_threads is not None:
            previous = numba.get_num_threads()
            numba.set_num_threads(min(int(numba_threads), numba.config.NUMBA_NUM_THREADS))
            stack.callback(numba.set_num_threads, previous)
        yield


def available_cpus() -> int:
    """CPUs this process may use, as :func:`joblib.cpu_count` reads them: the fewest of its
    affinity mask (a container's cpuset, ``taskset``), its cgroup's CPU quota (a container's
    ``cpus:``, rounded up) and ``LOKY_MAX_CPU_COUNT`` where that is set.

    The quota counts: it leaves the affinity mask as it is, and a trainer limited to 2 CPUs on a
    32-core host would otherwise start 32 fold-fit processes inside its 2 CPUs and its memory."""
    return max(1, joblib.cpu_count())


def configure_worker_threads(n_workers: int, cpu_count: int | None = None) -> int:
    """numba threads for each of ``n_workers`` worker processes sharing the machine's CPUs.

    Each worker gets an equal share, at least one: ``max(1, cpus // n_workers)``, so the workers'
    parallel regions together do not oversubscribe the cores. Nothing is set here: a worker passes
    the result to :func:`limit_threads` (which also caps it at
    :data:`numba.config.NUMBA_NUM_THREADS`) around the calls that run kernels.

    Parameters
    ----------
    n_workers : int
        Worker processes, at least 1.
    cpu_count : int or None
        CPUs to share; None: :func:`available_cpus` (the affinity mask where there is one).

    Returns
    -------
    int
        Threads per worker, at least 1.

    Raises
    ------
    ValueError
        If ``n_workers`` or ``cpu_count`` is not a positive integer.
    """
    if n_workers is None:
        raise ValueError("n_workers must be a positive integer, got None")
    _check_count(n_workers, "n_workers")
    _check_count(cpu_count, "cpu_count")
    cpus = available_cpus() if cpu_count is None else int(cpu_count)
    return max(1, cpus // int(n_workers))


def worker_environment(n_workers: int, environ: dict[str, str] | None = None) -> dict[str, str]:
    """Environment variables that size the thread pools of one of ``n_workers`` processes.

    numba's thread count set at run time is per calling thread, and a server calls kernels from
    many threads, so worker processes are sized where every thread sees it: their environment,
    read when numba and BLAS start. Each gets :func:`configure_worker_threads`'s share for numba
    and one BLAS thread; variables already set in ``environ`` (default: :data:`os.environ`) are
    kept, so an operator's explicit choice wins.

    Parameters
    ----------
    n_workers : int
    environ : dict, optional

    Returns
    -------
    dict of str to str
        The variables to add to the workers' environment.
    """
    environ = os.environ if environ is None else environ
    share = str(configure_worker_threads(n_workers))
    wanted = {
        "NUMBA_NUM_THREADS": share,
        "OMP_NUM_THREADS": share,
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }
    return {name: value for name, value in wanted.items() if name not in environ}
