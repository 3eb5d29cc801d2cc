"""Private mount namespaces for the tests that need a small disk of their own: a tmpfs of a few
KiB or MiB, mounted where only the process under test sees it (``unshare``); such tests are
skipped where the system allows no such namespace."""

from __future__ import annotations

import shutil
import subprocess

import pytest


def namespaces_available() -> bool:
    """Whether this system lets an unprivileged process mount a tmpfs in a namespace of its
    own."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return False
    probe = [unshare, "--user", "--map-root-user", "--mount", "sh", "-c",
             "mount -t tmpfs -o size=1m tmpfs /mnt"]  # fmt: skip
    return subprocess.run(probe, capture_output=True, check=False).returncode == 0


needs_namespaces = pytest.mark.skipif(
    not namespaces_available(), reason="no private mount namespace (unshare) for a small tmpfs"
)
