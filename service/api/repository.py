"""Where models live: a directory of model directories, or one model directory.

What the repository may hold: directories whose names are not UTF-8 are skipped (they could not
be named in any answer) and logged once; symbolic links that lead out of the repository, the
model directory itself or anything in it, are refused unless ``ALLOW_EXTERNAL_SYMLINKS`` is set.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from service.api.traffic import TRAFFIC_FILE_NAME
from service.model import ArtifactError
from service.model.artifact import read_manifest

logger = logging.getLogger("service.api")


class Repository:
    """Where models live: a directory of model directories, or one model directory.

    Parameters
    ----------
    root : Path
        The repository, or the model directory when ``single`` is true.
    single : bool
        ``root`` is one model (MODEL_DIR), named by its manifest's ``name`` when the server
        first looks (else by its directory).
    """

    def __init__(
        self,
        root: Path,
        single: bool = False,
        allow_external_symlinks: bool = False,
        traffic_file: Path | None = None,
    ) -> None:
        self.root = Path(root)
        self.single = single
        self.allow_external_symlinks = allow_external_symlinks
        # The traffic policies (service.api.traffic): TRAFFIC_FILE, else traffic.json in a
        # repository; a single model has none unless TRAFFIC_FILE names one.
        if traffic_file is None and not single:
            traffic_file = self.root / TRAFFIC_FILE_NAME
        self.traffic_file = traffic_file
        self._single_name: str | None = None
        self._skipped: set[str] = set()  # names logged as skipped, so logged once

    def scan(self) -> dict[str, Path]:
        """The models there now, by name (directories whose names are not UTF-8 left out)."""
        if self.single:
            if self._single_name is None:
                self._single_name = self._manifest_name() or self.root.name
            return {self._single_name: self.root}
        if not self.root.is_dir():
            return {}
        found, skipped = {}, set()
        for child in sorted(self.root.iterdir()):
            # Staging and retired directories of an artifact being written start with a dot.
            if child.name.startswith(".") or not child.is_dir():
                continue
            if _is_utf8(child.name):
                found[child.name] = child
                continue
            skipped.add(child.name)
            if child.name not in self._skipped:
                logger.warning(
                    "skipping %s in the %s: its name is not UTF-8, so no answer could name it; "
                    "rename it",
                    ascii(child.name),
                    self.describe(),
                )
        self._skipped = skipped
        return found

    def check_links(self, path: Path) -> None:
        """Refuse a model directory that is, or holds, a symbolic link to a place outside the
        repository (the model's directory, for one model), unless ALLOW_EXTERNAL_SYMLINKS.

        Raises
        ------
        ArtifactError
            Naming the link and where it leads.
        """
        if self.allow_external_symlinks:
            return
        inside = os.path.realpath(self.root)
        links = [path] if path.is_symlink() else []
        for directory, subdirectories, files in os.walk(path):
            for name in subdirectories + files:
                if os.path.islink(os.path.join(directory, name)):
                    links.append(Path(directory, name))
        for link in links:
            target = os.path.realpath(link)
            if os.path.commonpath([inside, target]) != inside:
                raise ArtifactError(
                    f"{link} is a symbolic link to {target}, outside the "
                    f"{self.describe()}: refused (ALLOW_EXTERNAL_SYMLINKS=true serves it)"
                )

    def _manifest_name(self) -> str | None:
        try:
            return str(read_manifest(self.root).get("name") or "") or None
        except ArtifactError:
            return None

    def describe(self) -> str:
        """In words, for messages: "repository <path>" or "model <path>"."""
        return f"model {self.root}" if self.single else f"repository {self.root}"


def _is_utf8(name: str) -> bool:
    """Whether a file name read from the system was valid UTF-8 (undecodable bytes come back
    as lone surrogates)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
