"""What the docs tell a newcomer to type does what they say: `make help` names real values, and
the compose file never looks our images up in a registry."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.docs import markdown


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_help_prints_the_values_of_the_variables_it_names():
    printed = subprocess.run(
        ["make", "--no-print-directory", "help", "PORT=9123"],
        cwd=markdown.ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "$(" not in printed, printed
    (run,) = [line for line in printed.splitlines() if line.strip().startswith("make run ")]
    assert "models on 127.0.0.1:9123" in run


def test_our_images_are_built_never_pulled():
    """A service whose image the compose file builds (its own `build:`, or the image of one
    that has it) says `pull_policy: never`: compose then builds a missing image instead of
    asking a registry for it first, which offline fails or, online, could fetch a stranger's."""
    compose = yaml.safe_load((markdown.ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    built = {service["image"] for service in services.values() if "build" in service}
    ours = {name: s for name, s in services.items() if s.get("image") in built}
    assert {"trainer", "api", "dask-scheduler", "dask-worker", "cluster-trainer"} <= set(ours)
    pulled = {name for name, service in ours.items() if service.get("pull_policy") != "never"}
    assert not pulled, f"these services may pull our image from a registry: {sorted(pulled)}"


def test_the_api_keeps_its_snapshots_on_a_volume_it_may_write():
    """SNAPSHOTS_DIR of the api is a named volume mounted writable (the models stay read-only),
    which the trainer mounts too (to restore), and the image makes the mount point the service
    user's, so that a new volume starts writable by the server."""
    compose = yaml.safe_load((markdown.ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    where = services["api"]["environment"]["SNAPSHOTS_DIR"]
    for name in ("api", "trainer"):
        mounts = {mount.split(":")[1]: mount.split(":") for mount in services[name]["volumes"]}
        assert where in mounts, name
        volume, _, *mode = mounts[where]
        assert volume in compose["volumes"]
        assert "ro" not in mode, name
    assert mounts["/models"] == ["models", "/models"]  # the trainer's, writable
    api_models = [m for m in services["api"]["volumes"] if m.startswith("models:")]
    assert api_models == ["models:/models:ro"]
    dockerfile = (markdown.ROOT / "Dockerfile").read_text()
    owned = next(line for line in dockerfile.splitlines() if "chown besvm:besvm" in line)
    assert where in owned.split()


def test_every_image_can_kill_the_workers_of_an_abandoned_joblib_pool():
    """A selection cut by its budget abandons its joblib pool; loky kills the workers through
    psutil, or `pgrep`, which slim images lack: without either, the command waited about 330 s
    at its exit (the workers' 300 s idle timeout). So each lock that installs joblib installs
    psutil too, on Linux (a pin's environment marker, if any, true there)."""
    linux = {"sys_platform": "linux", "platform_system": "Linux", "os_name": "posix"}
    checked = []
    for lock in sorted(markdown.ROOT.glob("requirements-*.lock")):
        installed = set()
        for line in lock.read_text().splitlines():
            if "==" not in line or line.startswith((" ", "#")):
                continue
            pin = Requirement(line.rstrip(" \\"))
            if pin.marker is None or pin.marker.evaluate(linux):
                installed.add(canonicalize_name(pin.name))
        if "joblib" in installed:
            checked.append(lock.name)
            assert "psutil" in installed, f"{lock.name} installs joblib without psutil"
    assert "requirements-service.lock" in checked  # the image's
