"""``python -m service.api``: serve the model repository (or MODEL_DIR) with uvicorn.

With ``WORKERS`` > 1, uvicorn's supervisor starts that many processes on one listening socket;
each builds the app from the environment and loads the repository itself (memory-mapped
catalogues share their pages between them). SIGHUP to the supervisor is passed on to every
worker, which rescans its repository (uvicorn's own answer to SIGHUP, restarting the workers,
would start them with no old version to fall back on if the new one is broken).
"""

from __future__ import annotations

import copy
import os
import signal

import uvicorn
from uvicorn.config import LOGGING_CONFIG
from uvicorn.supervisors import Multiprocess

from service.api.app import create_app
from service.api.connections import ConnectionLimits, limited_config
from service.api.settings import Settings
from service.model.threads import worker_environment

# Seconds a worker process has to answer its supervisor's health check.
WORKER_HEALTHCHECK_S = 30


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

    def terminate_all(self) -> None:
        # Refuse new connections from now on: the workers close their copies of the listening
        # socket as they drain, but the kernel would go on queueing connections on this one,
        # which nobody accepts any more (they would hang, then be reset).
        for sock in self.sockets:
            sock.close()
        super().terminate_all()

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
    settings = Settings()
    options = dict(
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        log_config=_logging_config(settings.log_level),
        access_log=settings.access_log,
        # Keep-alive connections outlive a short pause of a client's (uvicorn's default is 5 s).
        timeout_keep_alive=settings.keep_alive_s,
        timeout_graceful_shutdown=settings.shutdown_timeout_s,
        # The supervisor kills a worker that does not answer its ping in time, a starting one
        # included: importing the libraries alone can take longer than uvicorn's 5 s on a busy
        # host, and every replacement would be killed the same way.
        timeout_worker_healthcheck=WORKER_HEALTHCHECK_S,
        limits=ConnectionLimits(
            settings.header_timeout_s, settings.body_timeout_s, settings.max_connections
        ),
    )
    # Until the app's lifespan handles it, a SIGHUP (a reload request) must not end the process.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    if settings.workers == 1:
        # uvicorn drains on SIGTERM, then raises the signal again for the handler it found:
        # a drained shutdown is a success, exit status 0 (not death by SIGTERM).
        server = uvicorn.Server(limited_config(create_app(settings), **options))
        signal.signal(signal.SIGTERM, lambda signum, frame: None)
        server.run()
        return
    # Worker processes import the factory by name and read the same environment, which sizes
    # their thread pools so that together they do not oversubscribe the cores.
    os.environ.update(worker_environment(settings.workers))
    config = limited_config(
        "service.api.app:create_app", factory=True, workers=settings.workers, **options
    )
    RescanningSupervisor(config, sockets=[config.bind_socket()]).run()


if __name__ == "__main__":
    main()
