"""The data plane's catalogue work: a model's catalogue read (items, counts, facets), updated
and served at once, and its snapshots taken and restored as jobs."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from service.api.errors import WorkTimeoutError
from service.api.jobs import DONE, RESTORE, SNAPSHOT, Claim, JobKind, JobRecords, Jobs
from service.api.machinery.limits import RequestHold, WorkLimiter
from service.api.registry import ModelRegistry
from service.api.versions import ModelSnapshot
from service.model import InvalidInputError, ModelNotReadyError, NotFoundError
from service.model.errors import ArtifactError, brief
from service.model.search import Catalogue, Filter, SearchIndex, UpdateResult
from service.model.search.catalogue import Facet
from service.model.search.snapshots import (
    Snapshot,
    described_snapshot,
    list_snapshots,
    new_snapshot_name,
    remove_unfinished,
    snapshot_in,
)
from service.model.search.store import CommitGate

# Values a facet answers by default, and at most.
DEFAULT_FACET_VALUES = 10
MAX_FACET_VALUES = 1000


class CataloguePlane:
    """A model's catalogue and its snapshots: a part of
    :class:`~service.api.dataplane.DataPlane`, which holds the settings and state read here."""

    registry: ModelRegistry
    work: WorkLimiter
    jobs: Jobs
    snapshots_dir: Path | None
    has_siblings: bool

    # -- catalogues ----------------------------------------------------------------------------

    def catalogue(self, name: str) -> tuple[ModelSnapshot, Catalogue]:
        """The catalogue version model ``name`` serves; NotFoundError without one."""
        snapshot = self.snapshot(name)
        return snapshot, snapshot.require_search().require_catalogue()

    async def catalogue_item(
        self, name: str, item_id: str
    ) -> tuple[ModelSnapshot, int, dict[str, Any]]:
        """The catalogue version and attributes of one item of model ``name``'s catalogue
        (looked up on a worker thread: the shards may be held elsewhere); NotFoundError if it
        is not there."""
        snapshot, catalogue = self.catalogue(name)

        def find() -> dict[str, Any]:
            (position,) = catalogue.lookup([item_id]).tolist()
            if position < 0:
                raise NotFoundError(f"model {snapshot.name!r}: no catalogue item {brief(item_id)}")
            return catalogue.attributes_at([position])[0]

        self.work.admit()
        return snapshot, catalogue.version, await self.work.run(self.work.pool(), find)

    async def update_catalogue(
        self,
        name: str,
        size: int,
        change: Callable[[SearchIndex, CommitGate], UpdateResult],
        hold: RequestHold | None = None,
        work_bytes: Callable[[SearchIndex], int] | None = None,
    ) -> tuple[ModelSnapshot, UpdateResult]:
        """Run ``change`` (an upsert or a deletion of ``size`` items) on model ``name``'s search
        index, on a worker thread, then serve the version it wrote before answering.

        The change is on disk when it returns (see :mod:`service.model.search.store`); the
        version served here is then at least the one written. Other worker processes are told
        at once (SIGHUP through the supervisor, which rescans every worker), and in any case
        see it at their next rescan (RELOAD_INTERVAL_S). At REQUEST_TIMEOUT_S a change not yet
        committing is abandoned (its gate: it never commits, the answer is 504); one
        committing is waited for (its answer is the change's).

        Parameters
        ----------
        name : str
        size : int
        change : callable
            ``change(index, gate)``, the gate to pass to the index's update.
        hold : RequestHold, optional
            The request's bytes of the memory budget: ``work_bytes(index)`` more are taken
            before the change runs (503 when they do not fit now, 413 when they never could).
        work_bytes : callable, optional
            What the change will hold of memory (it may refuse the change first).

        Raises
        ------
        BatchTooLargeError
            More than MAX_BATCH_SIZE items.
        ModelNotReadyError
            The version written could not be loaded (the reason says why; it is on disk).
        WorkTimeoutError
            Abandoned at REQUEST_TIMEOUT_S: nothing was applied.
        """
        self.check_batch(size, "ids")
        snapshot = self.snapshot(name)
        index = snapshot.require_search()
        if hold is not None and work_bytes is not None:
            hold.add(work_bytes(index), "the update's work")
        gate = CommitGate()
        self.work.admit()
        try:
            result = await self.work.run(
                self.work.pool(), lambda: change(index, gate), stop=gate.abandon
            )
        except WorkTimeoutError as error:
            raise WorkTimeoutError(
                f"{error}: the update was not applied, and never will be (nothing of it was "
                "written); send it again"
            ) from None
        return await self._serve_written(snapshot.name, result), result

    async def _serve_written(self, name: str, result: UpdateResult) -> ModelSnapshot:
        """Serve the catalogue version that an update of model ``name`` wrote (``result``), and
        tell the other worker processes; the snapshot that serves it.

        Raises
        ------
        ModelNotReadyError
            The version written could not be loaded (the reason says why; it is on disk).
        """
        entry = await self.registry.load(name, force=False)
        served = entry.snapshot
        catalogue = None if served is None or served.search is None else served.search.catalogue
        if served is None or catalogue is None or catalogue.version < result.version:
            raise ModelNotReadyError(
                f"model {name!r}: catalogue version {result.version} was written but is not "
                f"served: {entry.reason}"
            )
        if self.has_siblings:
            os.kill(os.getppid(), signal.SIGHUP)
        return served

    async def count(self, name: str, query_filter: Filter | None) -> tuple[ModelSnapshot, int, int]:
        """The catalogue version of model ``name`` and its live items that ``query_filter``
        allows (None: all), exact (on a worker thread: the shards may be held elsewhere)."""
        snapshot, catalogue = self.catalogue(name)
        self.work.admit()
        count = await self.work.run(self.work.pool(), lambda: catalogue.count(query_filter))
        return snapshot, catalogue.version, count

    async def facet(
        self, name: str, key: str, query_filter: Filter | None, limit: int | None
    ) -> tuple[ModelSnapshot, int, Facet]:
        """The catalogue version of model ``name`` and the counts of its live items that
        ``query_filter`` allows per value of attribute ``key``: the ``limit`` values (default
        :data:`DEFAULT_FACET_VALUES`, at most :data:`MAX_FACET_VALUES`) with the most."""
        snapshot, catalogue = self.catalogue(name)
        limit = DEFAULT_FACET_VALUES if limit is None else limit
        if limit > MAX_FACET_VALUES:
            raise InvalidInputError(f"limit must be at most {MAX_FACET_VALUES}, got {limit}")
        self.work.admit()
        facet = await self.work.run(
            self.work.pool(), lambda: catalogue.facet(key, query_filter, limit)
        )
        return snapshot, catalogue.version, facet

    # -- snapshots -----------------------------------------------------------------------------

    def snapshots_of(self, name: str) -> Path:
        """Where model ``name``'s catalogue snapshots are kept; NotFoundError without
        SNAPSHOTS_DIR."""
        if self.snapshots_dir is None:
            raise NotFoundError(
                "this server keeps no catalogue snapshots: set SNAPSHOTS_DIR to a directory it "
                "may write (or take one with python -m training index --snapshot OUT)"
            )
        return self.snapshots_dir / name

    async def _claim(self, records: JobRecords, kind: JobKind, name: str) -> Claim:
        """``kind``'s lock on the catalogue for job ``name`` (JobInProgressError: one runs),
        taken on a worker thread (files); a snapshot's first removes what snapshots
        interrupted before it left half-written (hidden staging directories)."""

        def claim() -> Claim:
            try:
                claimed = records.claim(kind, name)
            except OSError as error:  # SNAPSHOTS_DIR not writable: said, never a 500
                raise ArtifactError(f"cannot write {records.directory}: {error}") from None
            if kind is SNAPSHOT:
                remove_unfinished(records.directory)
            return claimed

        self.work.admit()
        # Untimed: a claim is taken or not, never left held by a request that stopped waiting.
        return await self.work.run(self.work.pool(), claim, timed=False)

    async def take_snapshot(
        self, name: str, wait: bool, answer: Callable[[ModelSnapshot, Snapshot], dict[str, Any]]
    ) -> tuple[ModelSnapshot, Claim, dict[str, Any] | None]:
        """Start a snapshot of model ``name``'s newest catalogue version under SNAPSHOTS_DIR, a
        job (see :mod:`service.api.jobs`) on a thread of its own while searches and updates go
        on, and wait for it up to REQUEST_TIMEOUT_S if ``wait``: the model's snapshot that
        serves, the job's claim (its name, record and status route) and ``answer`` of the
        snapshot taken, None while it is under way.

        Raises
        ------
        JobInProgressError
            A snapshot of the catalogue is being taken.
        ModelError
            The snapshot failed within the wait (the error it would answer).
        """
        served = self.snapshot(name)
        index = served.require_search()
        index.require_catalogue()
        records = JobRecords(self.snapshots_of(served.name), served.name)
        claim = await self._claim(records, SNAPSHOT, new_snapshot_name())
        out = records.directory / claim.name

        async def finish(taken: Snapshot) -> dict[str, Any]:
            return answer(served, taken)

        task = self.jobs.start(claim, lambda progress: index.snapshot(out, progress), finish)
        return served, claim, await self.jobs.outcome(task, wait)

    async def restore_snapshot(
        self,
        name: str,
        snapshot_name: str,
        wait: bool,
        answer: Callable[[ModelSnapshot, UpdateResult, Snapshot], dict[str, Any]],
    ) -> tuple[ModelSnapshot, Claim, dict[str, Any] | None]:
        """Start the restore of model ``name``'s snapshot ``snapshot_name``, a job as
        :meth:`take_snapshot`: every file verified, then its version made the catalogue's
        newest and served by this process (the others told) before the job is done; the
        model's snapshot that serves, the job's claim and ``answer`` of the restore, None while
        it is under way.

        Raises
        ------
        JobInProgressError
            A restore of the catalogue is running.
        ModelError
            No such snapshot; or the restore failed within the wait (a damaged snapshot:
            SnapshotRefusedError, nothing written).
        """
        served = self.snapshot(name)
        index = served.require_search()
        records = JobRecords(self.snapshots_of(served.name), served.name)
        path = snapshot_in(records.directory, snapshot_name)
        claim = await self._claim(records, RESTORE, snapshot_name)

        def restore(progress: Claim) -> tuple[UpdateResult, Snapshot]:
            return index.restore(path, progress), described_snapshot(path)

        async def finish(restored: tuple[UpdateResult, Snapshot]) -> dict[str, Any]:
            result, verified = restored
            return answer(await self._serve_written(served.name, result), result, verified)

        task = self.jobs.start(claim, restore, finish)
        return served, claim, await self.jobs.outcome(task, wait)

    async def job_status(
        self,
        name: str,
        kind: JobKind,
        snapshot_name: str,
        answer: Callable[[ModelSnapshot, Snapshot], dict[str, Any]],
    ) -> tuple[ModelSnapshot, dict[str, Any]]:
        """The record of model ``name``'s snapshot or restore ``snapshot_name`` (see
        :mod:`service.api.jobs`): in progress, done with its result, or failed with its error.
        A snapshot's directory, complete, is its record's last word: done (``answer`` of it,
        where no record says so), whoever took it.

        Raises
        ------
        NotFoundError
            No such job known (nor, for a snapshot, such a snapshot).
        """
        served = self.snapshot(name)
        records = JobRecords(self.snapshots_of(served.name), served.name)

        def read() -> dict[str, Any]:
            record = records.status(kind, snapshot_name)
            if kind is SNAPSHOT and (record is None or record["state"] != DONE):
                with contextlib.suppress(NotFoundError):
                    taken = described_snapshot(snapshot_in(records.directory, snapshot_name))
                    record = records.done(kind, snapshot_name, answer(served, taken), record)
            if record is None:
                raise NotFoundError(
                    f"model {served.name!r}: no {kind.name} {brief(snapshot_name)} known"
                )
            return record

        self.work.admit()
        return served, await self.work.run(self.work.pool(), read, timed=False)

    async def list_snapshots(self, name: str) -> tuple[list[Snapshot], list[str]]:
        """Model ``name``'s catalogue snapshots, oldest first, and the directories there that
        hold none readable (see :func:`service.model.search.snapshots.list_snapshots`)."""
        where = self.snapshots_of(self.snapshot(name).name)
        self.work.admit()
        return await self.work.run(self.work.pool(), lambda: list_snapshots(where))
