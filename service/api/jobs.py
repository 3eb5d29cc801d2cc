"""Catalogue snapshots and restores as jobs: started by a request, finished whatever the
request's time, their state kept on disk where every worker process can read it.

A request starts the job (one of each kind at a time per catalogue: a second is refused with
:class:`JobInProgressError`, naming the one that runs) and waits for it up to
``REQUEST_TIMEOUT_S``; the route then answers what it did, or that it is still under way (202,
with the status route in ``Location``). The job goes on either way on a thread of its own, and
its status route says what became of it: in progress (with its progress), done (with its
result), or failed (with the error it would have answered). A 504 never means "done later".

Its state lives in the model's directory of ``SNAPSHOTS_DIR``, so that any worker process (and
a server restarted since) answers the same::

    SNAPSHOTS_DIR/<model>/.jobs/
        snapshot.lock, restore.lock     held (flock) by the process running that kind of job
                                        on the catalogue; the snapshot's name inside
        snapshot-<name>.json            a job's record: its state, when it started and
        restore-<name>.json             finished, its progress, its error or its result

A record that says "in progress" while no process holds its lock for it belongs to a job whose
process ended (killed, or shut down) before it finished: it is reported failed, interrupted.
Records are replaced by rename; the newest :data:`KEPT_RECORDS` of each kind are kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from service.api.errors import JobInProgressError, status_of
from service.model.errors import ModelError, NotFoundError, brief
from service.model.search.copies import Progress
from service.model.search.snapshots import SNAPSHOT_NAME

logger = logging.getLogger("service.api.jobs")

T = TypeVar("T")

JOBS_DIR = ".jobs"
# Finished records kept per kind and catalogue (older ones are removed as new jobs start).
KEPT_RECORDS = 100
# A job's progress is written to its record at most this often.
PROGRESS_INTERVAL_S = 1.0
# A record is a small document; one larger than this is not ours.
MAX_RECORD_BYTES = 1 << 20

IN_PROGRESS, DONE, FAILED = "in_progress", "done", "failed"
INTERRUPTED = (
    "interrupted: the server process running it ended before it finished (nothing of it is "
    "kept; a restore left the catalogue at the version before it or at the restored one)"
)


@dataclass(frozen=True)
class JobKind:
    """What differs between the kinds of job.

    Parameters
    ----------
    name : str
        ``snapshot`` or ``restore``: its lock's and records' names.
    running : str
        How a refusal says one is under way ("a snapshot of model 'x' is being taken").
    status_path : str
        The status route of a job, formatted with ``model`` and ``name``.
    """

    name: str
    running: str
    status_path: str


SNAPSHOT = JobKind(
    "snapshot", "a snapshot is being taken", "/v1/models/{model}/catalogue/snapshots/{name}"
)
RESTORE = JobKind(
    "restore", "a restore is running", "/v1/models/{model}/catalogue/snapshots/{name}/restore"
)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# A claim that finds the lock held tries again this many times, this far apart: a status read
# holds it for microseconds when no job runs (see JobRecords._running).
CLAIM_TRIES, CLAIM_RETRY_S = 5, 0.01


def _lock_soon(descriptor: int) -> None:
    """Lock ``descriptor`` (exclusive) if it is free now or within moments; BlockingIOError if
    not."""
    for attempt in range(CLAIM_TRIES):
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if attempt == CLAIM_TRIES - 1:
                raise
            time.sleep(CLAIM_RETRY_S)


class JobRecords:
    """The jobs of one model's catalogue, in ``directory`` (``SNAPSHOTS_DIR/<model>``).

    Parameters
    ----------
    directory : Path
    model : str
        The model's name, for messages and status routes.
    """

    def __init__(self, directory: Path, model: str) -> None:
        self.directory = directory
        self.model = model
        self.jobs = directory / JOBS_DIR

    def location(self, kind: JobKind, name: str) -> str:
        """The status route of job ``name`` of ``kind``."""
        return kind.status_path.format(model=self.model, name=name)

    def _record(self, kind: JobKind, name: str) -> Path:
        return self.jobs / f"{kind.name}-{name}.json"

    def _lock(self, kind: JobKind) -> Path:
        return self.jobs / f"{kind.name}.lock"

    def claim(self, kind: JobKind, name: str) -> Claim:
        """Hold ``kind``'s lock on the catalogue for job ``name`` and write its record (in
        progress).

        Raises
        ------
        JobInProgressError
            A job of ``kind`` runs on the catalogue (in any process): its name and status route
            are in the message.
        OSError
            The directory cannot be written.
        """
        self.jobs.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(self._lock(kind), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            _lock_soon(descriptor)
        except BlockingIOError:
            running = os.pread(descriptor, 256, 0).decode(errors="replace").strip()
            os.close(descriptor)
            if not SNAPSHOT_NAME.fullmatch(running):  # not written yet (or not ours)
                running = ""
            where = self.location(kind, running) if running else None
            raise JobInProgressError(
                f"model {self.model!r}: {kind.running} ({running or 'starting'}); one at a "
                f"time per catalogue: its status is at GET {where or 'its route'}, try again "
                "once it has finished",
                where,
            ) from None
        except BaseException:
            os.close(descriptor)
            raise
        try:
            # The name before the record: whoever reads a record in progress finds its name.
            os.ftruncate(descriptor, 0)
            os.pwrite(descriptor, name.encode(), 0)
            self._prune(kind)
            return Claim(self, kind, name, descriptor)
        except BaseException:
            os.close(descriptor)
            raise

    def _prune(self, kind: JobKind) -> None:
        """Remove all but the newest KEPT_RECORDS records of ``kind`` (the caller holds its
        lock: none of them is running)."""
        records = []
        for entry in os.scandir(self.jobs):
            if entry.name.startswith(f"{kind.name}-") and entry.name.endswith(".json"):
                with contextlib.suppress(OSError):
                    records.append((entry.stat().st_mtime, entry.path))
        for _, path in sorted(records, reverse=True)[KEPT_RECORDS - 1 :]:
            with contextlib.suppress(OSError):
                os.unlink(path)

    def write(self, kind: JobKind, name: str, record: dict[str, Any], durable: bool) -> None:
        """Replace job ``name``'s record by rename (synced to disk if ``durable``)."""
        target = self._record(kind, name)
        staging = self.jobs / f".{target.name}.tmp-{uuid.uuid4().hex[:8]}"
        try:
            with open(staging, "x") as handle:
                handle.write(json.dumps(record) + "\n")
                if durable:
                    handle.flush()
                    os.fsync(handle.fileno())
            os.replace(staging, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(staging)
            raise

    def status(self, kind: JobKind, name: str) -> dict[str, Any] | None:
        """Job ``name``'s record (None: there is none), a job whose process ended before it
        finished reported failed, and ``progress`` null unless it is in progress."""
        if not SNAPSHOT_NAME.fullmatch(name):
            return None
        try:
            with open(self._record(kind, name), "rb") as handle:
                record = json.loads(handle.read(MAX_RECORD_BYTES))
        except (OSError, ValueError):
            return None
        if not isinstance(record, dict):
            return None
        if record.get("state") == IN_PROGRESS and not self._running(kind, name):
            record.update(state=FAILED, error={"type": "interrupted", "message": INTERRUPTED})
        if record.get("state") != IN_PROGRESS:
            # Progress is for a job under way (a finished job's record reads so whoever wrote
            # it, as does JobRecords.done's).
            record["progress"] = None
        return record

    def done(
        self, kind: JobKind, name: str, result: dict[str, Any], record: dict[str, Any] | None
    ) -> dict[str, Any]:
        """Job ``name``'s record (``record``, or a new one where there is none) as done with
        ``result``: for a snapshot whose directory is complete, whatever its record says
        (the process that took it may have ended between the rename and the record)."""
        return {
            "model": self.model, "kind": kind.name, "name": name, "started": None,
            "finished": None, **(record or {}), "state": DONE, "progress": None, "error": None,
            "result": result,
        }  # fmt: skip

    def _running(self, kind: JobKind, name: str) -> bool:
        """Whether a process holds ``kind``'s lock for job ``name``."""
        try:
            descriptor = os.open(self._lock(kind), os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return os.pread(descriptor, 256, 0).decode(errors="replace").strip() == name
        except OSError as error:
            return error.errno in (errno.EAGAIN, errno.EACCES)
        else:
            return False
        finally:
            os.close(descriptor)  # a lock taken here goes with it


class Claim(Progress):
    """One job's hold on its kind's lock, and its record: written in progress at first, its
    progress at most every :data:`PROGRESS_INTERVAL_S` (from the job's thread), then done or
    failed, and the lock given back.

    Parameters
    ----------
    records : JobRecords
    kind : JobKind
    name : str
    descriptor : int
        The lock file, locked.
    """

    def __init__(self, records: JobRecords, kind: JobKind, name: str, descriptor: int) -> None:
        self.records, self.kind, self.name = records, kind, name
        self._descriptor: int | None = descriptor
        self._guard = threading.Lock()
        self._written_at = 0.0
        self.record: dict[str, Any] = {
            "model": records.model,
            "kind": kind.name,
            "name": name,
            "state": IN_PROGRESS,
            "started": _now(),
            "finished": None,
            "progress": None,
            "error": None,
            "result": None,
        }
        records.write(kind, name, self.record, durable=False)

    @property
    def location(self) -> str:
        """Its status route."""
        return self.records.location(self.kind, self.name)

    def current(self) -> dict[str, Any]:
        """Its record as it stands (a copy)."""
        with self._guard:
            return json.loads(json.dumps(self.record))

    def begin(self, stage: str, n_files: int, n_bytes: int) -> None:
        with self._guard:
            self.record["progress"] = {
                "stage": stage,
                "files_done": 0,
                "n_files": n_files,
                "bytes_done": 0,
                "n_bytes": n_bytes,
            }
        self._write_progress(force=True)

    def advance(self, n_bytes: int = 0, n_files: int = 0) -> None:
        with self._guard:
            progress = self.record["progress"]
            if progress is None:
                return
            progress["bytes_done"] += n_bytes
            progress["files_done"] += n_files
        self._write_progress()

    def _write_progress(self, force: bool = False) -> None:
        now = time.monotonic()
        with self._guard:
            if self.record["state"] != IN_PROGRESS:
                return
            if not force and now - self._written_at < PROGRESS_INTERVAL_S:
                return
            self._written_at = now
            with contextlib.suppress(OSError):  # progress is advisory: the job goes on
                self.records.write(self.kind, self.name, self.record, durable=False)

    def finish(self, result: dict[str, Any] | None, error: BaseException | None) -> None:
        """Record the job done with ``result`` or failed with ``error``, and give back the
        lock."""
        with self._guard:
            # Progress is for a job under way (as JobRecords.status and .done read it).
            self.record.update(finished=_now(), progress=None)
            if error is None:
                self.record.update(state=DONE, result=result)
            else:
                if isinstance(error, ModelError):
                    type_ = status_of(error)[1]
                    message = str(error)
                else:
                    type_, message = "internal_error", "internal error; the server log has details"
                self.record.update(state=FAILED, error={"type": type_, "message": message})
            try:
                self.records.write(self.kind, self.name, self.record, durable=True)
            except OSError as failure:
                logger.error("%s %s: its record cannot be written: %s", self.kind.name,
                             self.name, failure)  # fmt: skip
            finally:
                if self._descriptor is not None:
                    os.close(self._descriptor)
                    self._descriptor = None


def _in_thread(work: Callable[[], T], name: str) -> asyncio.Future[T]:
    """``work`` on a daemon thread of its own: a future of its result on the running loop. A
    daemon, so that a job never holds the process's exit (it is then reported interrupted)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if future.cancelled():
            return
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)

    def run() -> None:
        try:
            result, error = work(), None
        except BaseException as failure:  # handed to the loop whole
            result, error = None, failure
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=run, name=name, daemon=True).start()
    return future


class Jobs:
    """The jobs this process runs, and the wait of the requests that started them.

    Parameters
    ----------
    wait_s : float
        How long a request waits for its job (REQUEST_TIMEOUT_S).
    """

    def __init__(self, wait_s: float) -> None:
        self.wait_s = wait_s
        # The tasks under way: referenced until done (the loop keeps only weak references).
        self._tasks: set[asyncio.Task] = set()

    def start(
        self,
        claim: Claim,
        work: Callable[[Claim], T],
        finish: Callable[[T], Awaitable[dict[str, Any]]],
    ) -> asyncio.Task[dict[str, Any]]:
        """Run ``work`` (told of its progress through ``claim``) on a thread of its own, then
        ``finish`` on the loop (what the job answers, which its record keeps), and record the
        outcome."""

        async def job() -> dict[str, Any]:
            try:
                result = await finish(await _in_thread(lambda: work(claim), "besvm-job"))
            except asyncio.CancelledError:
                # The loop is closing (the server shuts down) while the thread works on: the
                # lock stays held until the process ends, after which the record, still in
                # progress, reads interrupted.
                raise
            except BaseException as error:
                if not isinstance(error, ModelError):
                    logger.error("%s %s failed", claim.kind.name, claim.name, exc_info=error)
                await asyncio.to_thread(claim.finish, None, error)  # a file synced: off the loop
                raise
            await asyncio.to_thread(claim.finish, result, None)
            return result

        task = asyncio.get_running_loop().create_task(job())
        self._tasks.add(task)
        task.add_done_callback(self._forget)
        return task

    def _forget(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: a job that failed after its request left is recorded

    async def outcome(self, task: asyncio.Task[T], wait: bool) -> T | None:
        """The job's result once done, within the request's time if ``wait`` (None: still
        under way); a job that failed meanwhile raises its error."""
        if wait:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(task), self.wait_s)
        if not task.done():
            return None
        return task.result()


def require_record(record: dict[str, Any] | None, kind: JobKind, model: str, name: str) -> dict:
    """``record``, or NotFoundError naming the job."""
    if record is None:
        raise NotFoundError(f"model {model!r}: no {kind.name} {brief(name)} known")
    return record
