"""``python -m service.api``: serve the model repository (or MODEL_DIR) with uvicorn.

With ``WORKERS`` > 1, uvicorn's supervisor starts that many processes on one listening socket;
each builds the app from the environment and loads the repository itself (memory-mapped
catalogues share their pages between them). SIGHUP to the supervisor is passed on to every
worker, which rescans its repository (uvicorn's own answer to SIGHUP, restarting the workers,
would start them with no old version to fall back on if the new one is broken).
"""

from __future__ import annotations

import copy
import faulthandler
import os
import signal

import uvicorn
from uvicorn.config import LOGGING_CONFIG
from uvicorn.supervisors import Multiprocess

from service.api.app import create_app
from service.api.settings import Settings
from service.model.threads import worker_environment


def _logging_config(level: str) -> dict:
    """uvicorn's logging, with the service's own logger on uvicorn's console handler."""
    config = copy.deepcopy(LOGGING_CONFIG)
    config["loggers"]["service"] = {
        "handlers": ["default"],
        "level": level.upper(),
        "propagate": False,
    }
    return config


class RescanningSupervisor(Multiprocess):
    """uvicorn's worker supervisor, passing SIGHUP on to the workers instead of restarting
    them.

    A worker still starting gets it once it has started (its handler is installed at the end of
    its start-up, and a SIGHUP before that would end it): it may have read the repository before
    the change that the SIGHUP announces.
    """

    def __init__(self, config: uvicorn.Config, sockets: list) -> None:
        super().__init__(config, sockets)
        self.hangups_due: list = []

    def handle_hup(self) -> None:
        self.hangups_due = list(self.processes)
        self._deliver_hangups()

    def keep_subprocess_alive(self) -> None:
        super().keep_subprocess_alive()
        self._deliver_hangups()

    def _deliver_hangups(self) -> None:
        # Workers replaced since (they died) read the repository afresh as they start.
        due = [process for process in self.hangups_due if process in self.processes]
        self.hangups_due = []
        for process in due:
            if process.pid is not None and process.is_ready(timeout=1):
                os.kill(process.pid, signal.SIGHUP)
            else:
                self.hangups_due.append(process)


def main() -> None:
    # A fatal signal (a memory-mapped file cut short under the server: SIGBUS) at least leaves
    # the Python traceback in the log; worker processes inherit it through the environment.
    os.environ.setdefault("PYTHONFAULTHANDLER", "1")
    faulthandler.enable()
    settings = Settings()
    options = dict(
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        log_config=_logging_config(settings.log_level),
        access_log=settings.access_log,
        # Keep-alive connections outlive a short pause of a client's (uvicorn's default is 5 s).
        timeout_keep_alive=30,
    )
    # Until the app's lifespan handles it, a SIGHUP (a reload request) must not end the process.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    if settings.workers == 1:
        uvicorn.run(create_app(settings), **options)
        return
    # Worker processes import the factory by name and read the same environment, which sizes
    # their thread pools so that together they do not oversubscribe the cores.
    os.environ.update(worker_environment(settings.workers))
    config = uvicorn.Config(
        "service.api.app:create_app", factory=True, workers=settings.workers, **options
    )
    RescanningSupervisor(config, sockets=[config.bind_socket()]).run()


if __name__ == "__main__":
    main()
