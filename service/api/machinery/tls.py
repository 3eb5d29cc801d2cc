"""TLS for both listeners: HTTPS through uvicorn, and gRPC over TLS, from TLS_CERT_FILE,
TLS_KEY_FILE and (mutual TLS) TLS_CLIENT_CA_FILE; the files are read again on SIGHUP.

**HTTPS.** uvicorn builds its context through :func:`reloadable_context` (its
``ssl_context_factory``, importable by name in each worker process). The context the listening
socket holds answers every handshake by handing the connection to the newest context built from
the files (``SSLSocket.context``, set in the server-name callback, which OpenSSL calls for every
ClientHello, with or without a server name): a SIGHUP builds a new one, and every later
handshake uses its certificate and its client CAs, a CA removed from the file included.

**gRPC.** :meth:`TlsFiles.grpc_credentials` are gRPC's dynamic credentials: gRPC asks, at each
new connection, whether the files' generation has changed since it last asked.

Every file is checked as a model's files are before a byte of it is read (a regular file of at
most :data:`MAX_PEM_BYTES`, opened without blocking: a FIFO or ``/dev/zero`` in its place is
refused, never waited on or read for ever). A reload that fails (a file missing or refused, a
key that does not match) logs why and keeps the context in force; a server never starts with
files it cannot read.
"""

from __future__ import annotations

import contextlib
import logging
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from service.model.artifact import open_regular
from service.model.errors import ArtifactError

logger = logging.getLogger("service.api")

# The largest TLS file read (a certificate chain, a key, a bundle of client CAs: kilobytes; the
# whole Mozilla bundle is 220 KB).
MAX_PEM_BYTES = 1 << 20


@dataclass(frozen=True)
class TlsFiles:
    """The PEM files of a server's TLS."""

    cert: Path
    key: Path | None = None
    client_ca: Path | None = None

    @classmethod
    def from_settings(cls, settings: Any) -> TlsFiles | None:
        if settings.tls_cert_file is None:
            return None
        return cls(settings.tls_cert_file, settings.tls_key_file, settings.tls_client_ca_file)

    def ssl_context(self) -> ssl.SSLContext:
        """A server context from the files as they are now (OSError, ssl.SSLError,
        TlsFileError)."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        with contextlib.ExitStack() as files:
            cert = files.enter_context(_checked(self.cert))
            key = None if self.key is None else files.enter_context(_checked(self.key))
            context.load_cert_chain(cert, key)
            if self.client_ca is not None:
                context.verify_mode = ssl.CERT_REQUIRED
                context.load_verify_locations(files.enter_context(_checked(self.client_ca)))
        return context

    def uvicorn_options(self) -> dict[str, Any]:
        """uvicorn's options serving HTTPS from these files."""
        return {
            "ssl_certfile": str(self.cert),
            "ssl_keyfile": None if self.key is None else str(self.key),
            "ssl_ca_certs": None if self.client_ca is None else str(self.client_ca),
            "ssl_cert_reqs": ssl.CERT_REQUIRED if self.client_ca else ssl.CERT_NONE,
            "ssl_context_factory": reloadable_context,
        }

    def pem(self) -> tuple[bytes, bytes, bytes | None]:
        """The key, the certificate chain and the client CAs, as bytes (gRPC reads PEM)."""
        chain = _read(self.cert)
        key = chain if self.key is None else _read(self.key)
        return key, chain, None if self.client_ca is None else _read(self.client_ca)

    def grpc_credentials(self):
        """gRPC server credentials that follow :func:`reload` (see the module docstring)."""
        import grpc

        def configuration():
            key, chain, client_ca = self.pem()
            return grpc.ssl_server_certificate_configuration([(key, chain)], client_ca)

        served = {"generation": _generation.value}

        def fetch():
            if served["generation"] == _generation.value:
                return None
            try:
                fresh = configuration()
            except (OSError, TlsFileError) as error:
                logger.error("gRPC TLS files not re-read, the ones before stay: %s", error)
                return None
            served["generation"] = _generation.value
            return fresh

        return grpc.dynamic_ssl_server_credentials(
            configuration(), fetch, require_client_authentication=self.client_ca is not None
        )


class TlsFileError(ValueError):
    """A TLS file that is not a regular file of at most :data:`MAX_PEM_BYTES`."""


@contextlib.contextmanager
def _checked(path: Path) -> Iterator[str]:
    """A name of ``path``'s file, open and checked as a model's files are
    (:func:`service.model.artifact.open_regular`: a regular file of at most
    :data:`MAX_PEM_BYTES`, opened without blocking): ``/dev/fd/N`` of the open file, so that
    OpenSSL reads the file checked, never what the name leads to by then (a FIFO would block
    the process, /dev/zero never end)."""
    try:
        handle = open_regular(path, MAX_PEM_BYTES)
    except ArtifactError as error:
        raise TlsFileError(str(error)) from None
    with handle:
        yield f"/dev/fd/{handle.fileno()}"


def _read(path: Path) -> bytes:
    """The bytes of ``path``'s file, checked as :func:`_checked` checks it."""
    with _checked(path) as name, open(name, "rb") as handle:
        return handle.read(MAX_PEM_BYTES + 1)


class _Generation:
    """How many times the TLS files were re-read in this process."""

    def __init__(self) -> None:
        self.value = 0
        self.lock = threading.Lock()


_generation = _Generation()


class _ServedContext:
    """The context of uvicorn's listening socket, and the newest one built from the files."""

    def __init__(self, files: TlsFiles) -> None:
        self.files = files
        self.current = files.ssl_context()
        self.front = files.ssl_context()
        self.front.sni_callback = self._handshake

    def _handshake(self, connection: ssl.SSLObject, server_name: str | None, _context) -> None:
        connection.context = self.current

    def reload(self) -> None:
        self.current = self.files.ssl_context()


# The contexts this process serves HTTPS with (one per uvicorn server).
_served: list[_ServedContext] = []


def reloadable_context(config, default_factory) -> ssl.SSLContext:
    """uvicorn's ``ssl_context_factory``: the front context of :class:`_ServedContext`, built
    from the files uvicorn's configuration names."""
    files = TlsFiles(
        Path(config.ssl_certfile),
        None if config.ssl_keyfile is None else Path(config.ssl_keyfile),
        None if config.ssl_ca_certs is None else Path(config.ssl_ca_certs),
    )
    served = _ServedContext(files)
    _served.append(served)
    return served.front


def reload() -> None:
    """Read the TLS files again (SIGHUP): new handshakes, HTTPS and gRPC, use them. Blocking
    (the app's rescans call it off the event loop); a file refused leaves the contexts as they
    were, the reason in the log."""
    for served in _served:
        try:
            served.reload()
        except (OSError, ssl.SSLError, TlsFileError) as error:
            logger.error("TLS files not re-read, the ones before stay: %s", error)
            return
    with _generation.lock:
        _generation.value += 1
    logger.info("TLS certificate files re-read")
