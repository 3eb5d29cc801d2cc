"""Progress bars of ``python -m training index --snapshot OUT`` and ``--restore SNAPSHOT``: one
tqdm bar per stage (copying; verifying, then restoring), in bytes, with the files done beside,
on standard error, as the other long commands show theirs: off with ``--quiet``, and off when
standard error is not a terminal (tqdm's ``disable=None``)."""

from __future__ import annotations

from tqdm.auto import tqdm

from service.model.search.copies import Progress


class ProgressBars(Progress):
    """A :class:`~service.model.search.copies.Progress` shown as tqdm bars.

    Parameters
    ----------
    enabled : bool
        False: no bar at all (``--quiet``).
    """

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.bar: tqdm | None = None
        self.files_done = self.n_files = 0

    def begin(self, stage: str, n_files: int, n_bytes: int) -> None:
        self.close()
        self.files_done, self.n_files = 0, n_files
        self.bar = tqdm(
            total=n_bytes, desc=stage, unit="B", unit_scale=True, unit_divisor=1024,
            disable=None if self.enabled else True, postfix=self._files(),
        )  # fmt: skip

    def advance(self, n_bytes: int = 0, n_files: int = 0) -> None:
        if self.bar is None:
            return
        if n_files:
            self.files_done += n_files
            self.bar.set_postfix_str(self._files(), refresh=False)
        self.bar.update(n_bytes)

    def _files(self) -> str:
        return f"{self.files_done}/{self.n_files} files"

    def close(self) -> None:
        """End the current bar (the next stage starts its own)."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def __enter__(self) -> ProgressBars:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
