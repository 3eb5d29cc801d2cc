"""``python -m service.api``: serve the model repository (or MODEL_DIR) with uvicorn.

With ``WORKERS`` > 1, uvicorn's supervisor starts that many processes on one listening socket;
each builds the app from the environment and loads the repository itself (memory-mapped
catalogues share their pages between them). SIGHUP to the supervisor is passed on to every
worker, which rescans its repository (uvicorn's own answer to SIGHUP, restarting the workers,
would start them with no old version to fall back on if the new one is broken).

Logs are configured here, for uvicorn and the service alike (LOG_LEVEL, LOG_FORMAT); the
service writes the access log itself (ACCESS_LOG), so uvicorn's is off. Several workers share
their metrics through prometheus-client's multi-process directory (PROMETHEUS_MULTIPROC_DIR:
the one given, else a private one for this run): see :mod:`service.api.machinery.metrics`.
"""

from __future__ import annotations

import faulthandler
import logging.config
import os
import signal
import ssl

import uvicorn
from uvicorn.supervisors import Multiprocess

from service.api.app import create_app
from service.api.machinery.auth import KeyFileError, KeyStore
from service.api.machinery.http_protocols import limited_config, service_limits
from service.api.machinery.metrics import forget_worker, multiprocess_directory
from service.api.machinery.observability import logging_config
from service.api.machinery.payloads import PayloadLogError, check_destination
from service.api.machinery.tls import TlsFileError, TlsFiles
from service.api.settings import Settings
from service.model.threads import worker_environment
from service.probes import forget_heartbeat, open_probe_port, probe_process

# Seconds a worker process has to answer its supervisor's health check. Long enough for a worker
# importing its libraries on a busy host (uvicorn's default, 5 s, is not), short because the
# supervisor waits this long, restarting nothing meanwhile, on a worker killed as it was pinged
# (its pipe never reports the end: the supervisor holds the other side too).
WORKER_HEALTHCHECK_S = 15


class RescanningSupervisor(Multiprocess):
    """uvicorn's worker supervisor, passing SIGHUP on to the workers instead of restarting
    them.

    A worker still starting gets it once it has started (its handler is installed at the end of
    its start-up, and a SIGHUP before that would end it): it may have read the repository before
    the change that the SIGHUP announces.
    """

    def __init__(
        self,
        config: uvicorn.Config,
        sockets: list,
        metrics_dir: str | None,
        heartbeat_dir: os.PathLike | None = None,
    ) -> None:
        super().__init__(config, sockets)
        self.hangups_due: list = []
        self.metrics_dir = metrics_dir
        self.heartbeat_dir = heartbeat_dir
        self._worker_pids: set[int] = set()

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
        self._forget_exited_workers()

    def _forget_exited_workers(self) -> None:
        """Mark the metrics of workers that have exited (and been replaced) dead: live gauges
        (requests in flight, versions served) then count live workers only; remove their
        heartbeats for the probe process."""
        pids = {process.pid for process in self.processes if process.pid is not None}
        for pid in self._worker_pids - pids:
            if self.metrics_dir is not None:
                forget_worker(pid, self.metrics_dir)
            # Its heartbeat goes with it: a later process given its pid is not it.
            forget_heartbeat(pid, self.heartbeat_dir)
        self._worker_pids = pids

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
    tls = TlsFiles.from_settings(settings)
    try:  # what every worker reads, read once here: a bad file stops the start with one line
        KeyStore(settings)
        if tls is not None:
            tls.ssl_context()
        check_destination(settings)
        probe_port = open_probe_port(settings.probe_host or settings.host, settings.probe_port)
    except (KeyFileError, TlsFileError, PayloadLogError, OSError, ssl.SSLError) as error:
        raise SystemExit(f"cannot start: {error}") from None
    options = dict(
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        log_config=logging_config(settings.log_level, settings.log_format),
        access_log=False,  # the service's own access lines carry the request id and duration
        # Keep-alive connections outlive a short pause of a client's (uvicorn's default is 5 s).
        timeout_keep_alive=settings.keep_alive_s,
        timeout_graceful_shutdown=settings.shutdown_timeout_s,
        # The supervisor kills a worker that does not answer its ping in time, a starting one
        # included: importing the libraries alone can take longer than uvicorn's 5 s on a busy
        # host, and every replacement would be killed the same way.
        timeout_worker_healthcheck=WORKER_HEALTHCHECK_S,
        limits=service_limits(settings),
        **({} if tls is None else tls.uvicorn_options()),
    )
    # Until the app's lifespan handles it, a SIGHUP (a reload request) must not end the process.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    logging.config.dictConfig(options["log_config"])  # uvicorn applies it later, for its own
    with probe_process(probe_port, settings.probe_stale_s) as heartbeat_dir:
        serve(settings.model_copy(update={"probe_heartbeat_dir": heartbeat_dir}), options)


def serve(settings: Settings, options: dict) -> None:
    """Run uvicorn with ``options``: in this process for one worker, else its supervisor."""
    if settings.workers == 1:
        # uvicorn drains on SIGTERM, then raises the signal again for the handler it found:
        # a drained shutdown is a success, exit status 0 (not death by SIGTERM).
        with multiprocess_directory(1, settings.prometheus_multiproc_dir):  # only checks one given
            server = uvicorn.Server(limited_config(create_app(settings), **options))
            signal.signal(signal.SIGTERM, lambda signum, frame: None)
            server.run()
        return
    # Worker processes import the factory by name and read the same environment (the heartbeat
    # directory included), which sizes their thread pools so that together they do not
    # oversubscribe the cores.
    os.environ.update(worker_environment(settings.workers))
    with multiprocess_directory(settings.workers, settings.prometheus_multiproc_dir) as metrics_dir:
        config = limited_config(
            "service.api.app:create_app", factory=True, workers=settings.workers, **options
        )
        RescanningSupervisor(
            config, [config.bind_socket()], metrics_dir, settings.probe_heartbeat_dir
        ).run()


if __name__ == "__main__":
    main()
