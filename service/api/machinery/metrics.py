"""Prometheus metrics of one app: built by the app factory, never at import time, each app in
its own :class:`~prometheus_client.CollectorRegistry` (several apps in one process never
collide).

**Several worker processes** (prometheus-client's multi-process mode): when
``PROMETHEUS_MULTIPROC_DIR`` is set, every process writes its values to files there and
``GET /metrics``, answered by any one worker, reads and aggregates all of them
(:class:`~prometheus_client.multiprocess.MultiProcessCollector`). ``python -m service.api`` with
``WORKERS`` > 1 makes a private directory for one run (:func:`multiprocess_directory`), and its
supervisor marks a worker's files dead when the worker exits (:func:`forget_worker`), so that
live gauges count live workers only. Counters and histograms of a worker that has exited keep
counting: what it served stays served.

Label values are bounded: routes by their template (``/v1/models/{name}/classify``, all unknown
paths as one ``unmatched``), models by the names of the repository's models (a request naming no
existing model is labelled ``""``), statuses by the HTTP codes the service answers.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

logger = logging.getLogger("service.api")

MULTIPROCESS_ENV = "PROMETHEUS_MULTIPROC_DIR"
PREFIX = "besvm"
CONTENT_TYPE = CONTENT_TYPE_LATEST

# From a one-digit /classify (tens of microseconds in process) to a search learning a code
# (seconds).
LATENCY_BUCKETS_S = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip
# Instances per request: powers of two up to the default MAX_BATCH_SIZE (1000).
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
# How long a request waits in a model's dynamic batching queue: nothing when the model is idle,
# up to a few batches' time under load.
QUEUE_BUCKETS_S = (
    0.00001, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
    0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip
# How long a request's reports wait before they are folded into the metrics (see
# PrometheusMetrics.fold): short beside any scrape interval.
FOLD_DELAY_S = 0.05
# The kinds of reports a request notes.
_HTTP, _GRPC, _BATCH, _DYNAMIC = "http", "grpc", "batch", "dynamic batch"
# A fold asked of the event loop from another thread, not yet armed there.
_ARMING = object()
LOAD_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class Metrics:
    """What the service reports, as calls: this base reports nothing (a data plane or registry
    built without metrics, e.g. in a unit test); :class:`PrometheusMetrics` records them."""

    def bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """Reports from threads other than ``loop``'s (gRPC calls) are folded on ``loop``."""

    def request_started(self) -> None:
        """A request came in (requests in flight)."""

    def request_finished(
        self, method: str, route: str, model: str, status: int, seconds: float
    ) -> None:
        """A request was answered with ``status`` in ``seconds``."""

    def grpc_finished(self, method: str, model: str, code: str, seconds: float) -> None:
        """A gRPC call of ``method`` (ModelInfer, ...) ended with status ``code`` in
        ``seconds``."""

    def batch(self, model: str, size: int) -> None:
        """Model ``model`` classified ``size`` instances in one request."""

    def batch_computed(self, model: str, instances: int, requests: int, waits: list[float]) -> None:
        """Dynamic batching started a batch of ``instances`` instances from ``requests``
        requests of model ``model``, after each request waited ``waits`` seconds."""

    def search_rows(self, model: str, rows: int) -> None:
        """A search of model ``model`` read ``rows`` catalogue rows (one per atom used)."""

    def model_loaded(self, model: str, version: str, previous: str | None, seconds: float) -> None:
        """Model ``model`` now serves ``version`` (instead of ``previous``), loaded in
        ``seconds``."""

    def model_load_failed(self, model: str) -> None:
        """A version of model ``model`` could not be loaded (or was refused)."""

    def model_retired(self, model: str, version: str | None) -> None:
        """Model ``model`` no longer serves ``version`` (unloaded or removed)."""

    def shadow_compared(
        self, alias: str, model: str, agreed: int, disagreed: int, seconds: float
    ) -> None:
        """Shadow ``model`` of ``alias`` answered a copy of a request in ``seconds``, its
        labels agreeing with the served ones on ``agreed`` instances (from any thread)."""

    def shadow_skipped(self, alias: str, model: str, reason: str) -> None:
        """A request drawn for shadow ``model`` of ``alias`` was not compared: ``reason`` is
        ``queue_full``, ``not_ready`` or ``failed`` (from any thread)."""

    def payload_dropped(self) -> None:
        """A payload record was dropped: the payload log's queue was full (from any thread)."""


class PrometheusMetrics(Metrics):
    """The service's metrics in a registry of their own (see the module docstring).

    Parameters
    ----------
    multiprocess_dir : path-like, optional
        prometheus-client's multi-process directory, where every process writes its values
        (the settings' ``PROMETHEUS_MULTIPROC_DIR``: prometheus-client chose its value files
        from the same variable when it was imported); None for a single process.
    """

    def __init__(self, multiprocess_dir: str | os.PathLike | None = None) -> None:
        self.multiprocess_dir = None if multiprocess_dir is None else str(multiprocess_dir)
        self.registry = CollectorRegistry(auto_describe=True)
        request_labels = ("method", "route", "model", "status")
        common = {"namespace": PREFIX, "registry": self.registry}
        self.requests = Counter(
            "http_requests",
            "HTTP requests answered, by method, route template, model and status.",
            request_labels,
            **common,
        )
        self.latency = Histogram(
            "http_request_duration_seconds",
            "Time from a request's arrival to the end of its answer, by method, route "
            "template, model and status.",
            request_labels,
            buckets=LATENCY_BUCKETS_S,
            **common,
        )
        self.in_flight = Gauge(
            "http_requests_in_flight",
            "Requests being answered now (summed over live worker processes).",
            multiprocess_mode="livesum",
            **common,
        )
        self.batch_size = Histogram(
            "classify_batch_size",
            "Instances per classification request, by model.",
            ("model",),
            buckets=BATCH_BUCKETS,
            **common,
        )
        # Dynamic batching's batches (service.api.batching), each by model.
        self.dynamic_batch_size, self.dynamic_batch_requests, self.queue_time = (
            Histogram(name, text, ("model",), buckets=buckets, **common)
            for name, text, buckets in (
                ("dynamic_batch_size", "Instances computed together in one batch.", BATCH_BUCKETS),
                (
                    "dynamic_batch_requests",
                    "Requests computed together in one batch.",
                    BATCH_BUCKETS,
                ),
                (
                    "dynamic_batch_queue_seconds",
                    "Time a request waited for its batch to start (0 when the model was idle).",
                    QUEUE_BUCKETS_S,
                ),
            )
        )
        self.rows_read = Counter(
            "search_rows_read",
            "Catalogue rows (one per atom, each over all items) read by searches, by model.",
            ("model",),
            **common,
        )
        self.load_time = Histogram(
            "model_load_duration_seconds",
            "Time to load and warm up a model version that was then served, by model.",
            ("model",),
            buckets=LOAD_BUCKETS_S,
            **common,
        )
        self.load_failures = Counter(
            "model_load_failures",
            "Model versions that failed to load or were refused, by model.",
            ("model",),
            **common,
        )
        # 1 while a live worker serves the version; 0 once none does (a multi-process value
        # cannot be removed, so a replaced version reads 0 in both modes alike).
        self.version_info = Gauge(
            "model_version_info",
            "1 for the version (sha256 of its manifest) a model serves, 0 for versions it "
            "served before.",
            ("model", "version"),
            multiprocess_mode="livemax",
            **common,
        )
        grpc_labels = ("method", "model", "code")
        self.grpc_requests = Counter(
            "grpc_requests",
            "gRPC calls answered, by method (ModelInfer, ...), model and status code.",
            grpc_labels,
            **common,
        )
        self.grpc_latency = Histogram(
            "grpc_request_duration_seconds",
            "Time from a gRPC call's arrival to its answer, by method, model and status code.",
            grpc_labels,
            buckets=LATENCY_BUCKETS_S,
            **common,
        )
        shadow_labels = ("alias", "model")
        self.shadow_instances = Counter(
            "shadow_instances",
            "Instances a shadow model answered a copy of, by alias, shadow model and outcome: "
            "agree (the served label) or disagree.",
            (*shadow_labels, "outcome"),
            **common,
        )
        self.shadow_skips = Counter(
            "shadow_skipped_requests",
            "Requests drawn for a shadow but not compared, by alias, shadow model and reason: "
            "queue_full, not_ready or failed.",
            (*shadow_labels, "reason"),
            **common,
        )
        self.shadow_latency = Histogram(
            "shadow_duration_seconds",
            "A shadow model's time to answer its copy of a request, by alias and shadow model "
            "(apart from the served request's latency).",
            shadow_labels,
            buckets=LATENCY_BUCKETS_S,
            **common,
        )
        self.payload_drops = Counter(
            "payload_records_dropped",
            "Payload log records dropped because the payload log's queue was full.",
            **common,
        )
        # Children by label values: .labels() costs a few microseconds a request otherwise.
        self._request_children: dict[tuple, tuple] = {}
        self._batch_children: dict[str, Histogram] = {}
        # What requests reported since the last fold (see :meth:`fold`); appended and taken
        # from either end by any thread, so nothing is lost between them.
        self._pending: collections.deque[tuple] = collections.deque()
        self._in_flight = 0
        self._fold_due: asyncio.TimerHandle | object | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # A scrape (on a thread) must not fold while the timer does: it would miss what the
        # other has taken but not yet recorded.
        self._folding = threading.Lock()

    # -- requests ------------------------------------------------------------------------------
    #
    # A request's own reports are noted, not recorded: folded into the metrics together at most
    # FOLD_DELAY_S later, and before every exposition. Recording them one request at a time
    # (five locked updates through prometheus-client's layers: the counter, the histogram's sum
    # and bucket, the in-flight gauge up and down) cost a one-digit request about as much as
    # its access line; folded hundreds at a time they cost a fraction of that.

    def request_started(self) -> None:
        self._in_flight += 1
        self._note()

    def request_finished(
        self, method: str, route: str, model: str, status: int, seconds: float
    ) -> None:
        self._in_flight -= 1
        self._pending.append((_HTTP, (method, route, model, str(status)), seconds))
        self._note()

    def grpc_finished(self, method: str, model: str, code: str, seconds: float) -> None:
        self._pending.append((_GRPC, (method, model, code), seconds))
        self._note()

    def batch(self, model: str, size: int) -> None:
        self._pending.append((_BATCH, model, size))
        self._note()

    def batch_computed(self, model: str, instances: int, requests: int, waits: list[float]) -> None:
        self._pending.append((_DYNAMIC, model, (instances, requests, waits)))
        self._note()

    def bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def _note(self) -> None:
        """Fold what is noted FOLD_DELAY_S from now, unless a fold is due already: from the
        event loop's thread, or another thread (a gRPC call's) once a loop is bound; at once
        where no event loop runs (a caller outside the server)."""
        if self._fold_due is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = self._loop
            if loop is None or loop.is_closed():
                self.fold()
                return
            # One hand-over to the loop per fold, not per report.
            self._fold_due = _ARMING
            loop.call_soon_threadsafe(self._arm_fold)
            return
        self._fold_due = loop.call_later(FOLD_DELAY_S, self.fold)

    def _arm_fold(self) -> None:
        self._fold_due = asyncio.get_running_loop().call_later(FOLD_DELAY_S, self.fold)

    def fold(self) -> None:
        """Record every report noted so far, and the requests in flight now, in the metrics:
        from the event loop (the timer) or a scrape's thread, one at a time."""
        with self._folding:
            self._fold()

    def _fold(self) -> None:
        self._fold_due = None
        self.in_flight.set(self._in_flight)
        pending = self._pending
        while pending:
            kind, labels, value = pending.popleft()
            if kind is _BATCH:
                child = self._batch_children.get(labels)
                if child is None:
                    child = self._batch_children[labels] = self.batch_size.labels(labels)
                child.observe(value)
                continue
            if kind is _DYNAMIC:
                instances, requests, waits = value
                self.dynamic_batch_size.labels(labels).observe(instances)
                self.dynamic_batch_requests.labels(labels).observe(requests)
                queue_time = self.queue_time.labels(labels)
                for wait in waits:
                    queue_time.observe(wait)
                continue
            children = self._request_children.get((kind, labels))
            if children is None:
                counter, histogram = (
                    (self.requests, self.latency)
                    if kind is _HTTP
                    else (self.grpc_requests, self.grpc_latency)
                )
                children = self._request_children[(kind, labels)] = (
                    counter.labels(*labels),
                    histogram.labels(*labels),
                )
            children[0].inc()
            children[1].observe(value)

    def search_rows(self, model: str, rows: int) -> None:
        self.rows_read.labels(model).inc(rows)

    # -- models --------------------------------------------------------------------------------

    def model_loaded(self, model: str, version: str, previous: str | None, seconds: float) -> None:
        self.load_time.labels(model).observe(seconds)
        if previous is not None and previous != version:
            self.version_info.labels(model, previous).set(0)
        self.version_info.labels(model, version).set(1)

    def model_load_failed(self, model: str) -> None:
        self.load_failures.labels(model).inc()

    def model_retired(self, model: str, version: str | None) -> None:
        if version is not None:
            self.version_info.labels(model, version).set(0)

    # -- shadows and payloads: off the request path, recorded at once --------------------------

    def shadow_compared(
        self, alias: str, model: str, agreed: int, disagreed: int, seconds: float
    ) -> None:
        self.shadow_instances.labels(alias, model, "agree").inc(agreed)
        self.shadow_instances.labels(alias, model, "disagree").inc(disagreed)
        self.shadow_latency.labels(alias, model).observe(seconds)

    def shadow_skipped(self, alias: str, model: str, reason: str) -> None:
        self.shadow_skips.labels(alias, model, reason).inc()

    def payload_dropped(self) -> None:
        self.payload_drops.inc()

    # -- exposition ----------------------------------------------------------------------------

    def exposition(self) -> bytes:
        """The metrics in Prometheus's text format: of every worker process in multi-process
        mode, else of this app. This process's reports are folded in first; other workers'
        are at most FOLD_DELAY_S behind."""
        self.fold()
        if self.multiprocess_dir is None:
            return generate_latest(self.registry)
        merged = CollectorRegistry()
        MultiProcessCollector(merged, path=self.multiprocess_dir)
        return generate_latest(merged)


@contextlib.contextmanager
def multiprocess_directory(workers: int, given: str | os.PathLike | None) -> Iterator[str | None]:
    """The multi-process directory of a server run, exported in ``PROMETHEUS_MULTIPROC_DIR`` to
    the worker processes started inside the ``with`` (their settings, and prometheus-client as
    they import it, read it there).

    One the user set (``given``, the settings' ``PROMETHEUS_MULTIPROC_DIR``) is used as it is
    (and left in place); otherwise, with ``workers`` > 1, a fresh private one is made and
    removed at the end. A single worker without one needs none.
    """
    if given is not None:
        given = str(given)
        leftovers = [name for name in os.listdir(given) if name.endswith(".db")]
        if leftovers:
            logger.warning(
                "%s=%s holds %d files of an earlier run: their counts are included; empty it "
                "before starting to count this run alone",
                MULTIPROCESS_ENV,
                given,
                len(leftovers),
            )
        yield given
        return
    if workers <= 1:
        yield None
        return
    path = tempfile.mkdtemp(prefix="besvm-metrics-")
    os.environ[MULTIPROCESS_ENV] = path
    try:
        yield path
    finally:
        os.environ.pop(MULTIPROCESS_ENV, None)
        shutil.rmtree(path, ignore_errors=True)


def forget_worker(pid: int, multiprocess_dir: str) -> None:
    """Drop the live gauges of a worker process that has exited (its counters stay)."""
    mark_process_dead(pid, multiprocess_dir)
