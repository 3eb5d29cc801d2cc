"""The README's and the docs' examples run as printed (tests/docs/markdown.py says how they are
marked): each marked command and code block runs, against a real server process where it
calls one, and prints what the docs show after it."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.serving import ServerNotReady, free_port, server_process
from tests.docs import markdown
from tests.docs.markdown import Block, Server

EXAMPLE_TIMEOUT_S = 900
# Settings of every server the examples call, unless a marker sets them: what `make run`
# serves, with the admin key the docs' admin examples send and gRPC on.
SERVED = {"DEFAULT_MODEL": "digits", "ADMIN_TOKEN": "s3cret", "ACCESS_LOG": "false"}

WITH_EXAMPLES = [path for path in markdown.documents() if markdown.examples(path)]
# The commands the examples call besides our own (Debian: apt-get install curl openssl).
TOOLS = ("bash", "curl", "openssl", "python3", "seq")


@pytest.fixture(scope="module")
def tools():
    """Skips when a tool the examples call is missing, unless in CI (``CI=true``), where the
    examples run regardless and fail loudly."""
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing and os.environ.get("CI") != "true":
        pytest.skip(
            f"the docs' examples call {', '.join(missing)}: apt-get install {' '.join(missing)}"
        )


class Servers:
    """The servers the examples ask for, started on first use, one per name and settings,
    each on its own copy of the digits model with its search model and catalogue."""

    def __init__(self, model: Path, root: Path, stack: contextlib.ExitStack):
        self.model, self.root, self.stack = model, root, stack
        self.running: dict[tuple[Server, Path], tuple[int, int]] = {}

    def get(self, server: Server, scratch: Path) -> tuple[int, int]:
        """(HTTP port, gRPC port) of the server, relative settings read in ``scratch``."""
        settings = {
            variable: str(scratch / value) if (scratch / value).exists() else value
            for variable, value in server.settings
        }
        key = (server, scratch if settings != dict(server.settings) else self.root)
        if key not in self.running:
            grpc = free_port()
            env = {
                **{
                    k: v
                    for k, v in os.environ.items()
                    if k not in ("MODEL_DIR", "MODEL_REPOSITORY")
                },
                **SERVED,
                "GRPC_PORT": str(grpc),
                **settings,
            }
            if "MODEL_DIR" in settings:  # the page's own model
                del env["DEFAULT_MODEL"]
            else:
                repository = self.root / f"repository-{len(self.running)}"
                shutil.copytree(self.model, repository / "digits")
                env["MODEL_REPOSITORY"] = str(repository)
            probe = {}
            if "TLS_CERT_FILE" in settings:  # polled with the client certificate the page made
                probe = {
                    "verify": False,
                    "cert": (scratch / "client.pem", scratch / "client-key.pem"),
                }
            try:
                process = self.stack.enter_context(
                    server_process(
                        [sys.executable, "-m", "service.api"],
                        env,
                        ready_timeout=120,
                        new_session=False,
                        probe=probe,
                    )
                )
            except ServerNotReady as error:
                pytest.fail(f"the server {server.name} did not start: {error}")
            self.running[key] = (process.port, grpc)
        return self.running[key]


@pytest.fixture(scope="module")
def servers(search_model_dir, tmp_path_factory):
    with contextlib.ExitStack() as stack:
        yield Servers(search_model_dir, tmp_path_factory.mktemp("example-servers"), stack)


def _run(block: Block, scratch: Path, text: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("MODEL_DIR", "MODEL_REPOSITORY")}
    if block.language in ("python", "py"):
        script = scratch / f"example_{block.line}.py"
        script.write_text(text)
        command = [sys.executable, script.name]
    else:
        command = ["bash", "-e", "-o", "pipefail", "-c", text]
    return subprocess.run(
        command,
        cwd=scratch,
        env=env,
        capture_output=True,
        text=True,
        timeout=EXAMPLE_TIMEOUT_S,
        check=False,
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "document", WITH_EXAMPLES, ids=[str(p.relative_to(markdown.ROOT)) for p in WITH_EXAMPLES]
)
def test_the_examples_run_as_printed(document, tools, servers, tmp_path):
    scratch = tmp_path
    (scratch / ".venv").symlink_to(markdown.ROOT / ".venv")
    for block, output in markdown.examples(document):
        text = block.text
        server = markdown.server_of(block)
        if server is not None:
            port, grpc = servers.get(server, scratch)
            text = text.replace("localhost:8000", f"localhost:{port}")
            text = text.replace("localhost:8081", f"localhost:{grpc}")
        result = _run(block, scratch, text)
        said = f"{block.where}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr[-4000:]}"
        assert result.returncode == 0, f"exit {result.returncode}: {said}"
        if output is not None:
            found = markdown.differences(result.stdout, output.text)
            assert not found, f"{block.where} prints otherwise than {output.where}:\n" + "\n".join(
                found
            )
        elif server is not None:
            assert not markdown.errors_in(result.stdout), f"an error answer: {said}"
