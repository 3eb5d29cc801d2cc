"""What the docs tell a newcomer to type does what they say: `make help` names real values, and
the compose file never looks our images up in a registry."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

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
