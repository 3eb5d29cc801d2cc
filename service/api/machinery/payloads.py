"""Payload logging: a sampled share of inference requests and their answers, as CloudEvents.

``PAYLOAD_LOG_RATE`` of the inference requests (``/classify``, ``/search``, their
``/v1/models/{name}/...`` forms, ``/v2/models/{name}/infer`` and gRPC ``ModelInfer``; 0, the
default: none) are written, each as two JSON lines in the CloudEvents 1.0 JSON format (KServe's
logger writes the same pair): ``org.besvm.inference.request`` with the request's body and
``org.besvm.inference.response`` with the answer's, both with the request's id, the route, the
model and version that answered and the status.

**Off the request path.** The request queues the values (its body, the answer's body, a few
strings) and a writer thread (the access log's :class:`~service.api.machinery.observability.
BackgroundStreamHandler`, a second one on its own stream) makes the lines and writes them. At
most ``PAYLOAD_LOG_QUEUE`` records wait: when the destination cannot keep up (a slow disk, a
pipe nobody reads), later records are dropped and counted (``besvm_payload_records_dropped_total``),
and no request ever waits. A body over ``PAYLOAD_LOG_MAX_BYTES`` is recorded without its data
(``truncated``, ``datasize``).
"""

from __future__ import annotations

import base64
import datetime
import os
import random
import socket
import sys
from collections.abc import Callable
from typing import IO, Any

import orjson
from google.protobuf import json_format

from service.api.machinery.metrics import Metrics
from service.api.machinery.observability import (
    BackgroundStreamHandler,
    current_request,
    fresh_request_id,
)
from service.api.settings import Settings

REQUEST_TYPE = "org.besvm.inference.request"
RESPONSE_TYPE = "org.besvm.inference.response"
STANDARD_OUTPUT = "stdout"
_JSON = "application/json"


class PayloadLog:
    """The sampled requests and answers of one process (see the module docstring).

    Parameters
    ----------
    settings : Settings
        PAYLOAD_LOG_RATE, PAYLOAD_LOG (``stdout`` or a file, ``{pid}`` replaced by the
        process's id), PAYLOAD_LOG_MAX_BYTES, PAYLOAD_LOG_QUEUE.
    metrics : Metrics
        Told of each record dropped.
    """

    def __init__(self, settings: Settings, metrics: Metrics) -> None:
        self.rate = settings.payload_log_rate
        self.max_bytes = settings.payload_log_max_bytes
        self.metrics = metrics
        destination = settings.payload_log
        self._file: IO[str] | None = None
        if destination == STANDARD_OUTPUT:
            stream: IO[str] = sys.stdout
        else:
            path = destination.replace("{pid}", str(os.getpid()))
            stream = self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115
        self.writer = BackgroundStreamHandler(stream, max_pending=settings.payload_log_queue)
        self.source = f"/besvm/{socket.gethostname()}/{os.getpid()}"
        # The current span's traceparent, when tracing is on (CloudEvents' distributed tracing
        # extension): the records of a request belong to its trace.
        self.traceparent: Callable[[], str | None] | None = None

    def sampled(self) -> bool:
        """Whether this request is recorded (an independent draw per request)."""
        return random.random() < self.rate

    def record(
        self,
        endpoint: str,
        request: bytes | Any,
        request_type: str,
        answer: bytes | Any,
        answer_type: str,
        status: int | str,
        version: str | None,
    ) -> None:
        """Queue the records of one exchange: bodies as bytes of their content type, or gRPC
        messages (made into JSON on the writer thread). A record that finds the queue full is
        dropped and counted."""
        context = current_request()
        request_id = None if context is None else context.request_id
        model = None if context is None else context.model or None
        now = datetime.datetime.now(datetime.UTC).isoformat()
        traceparent = None if self.traceparent is None else self.traceparent()
        for kind, body, content_type in (
            (REQUEST_TYPE, request, request_type),
            (RESPONSE_TYPE, answer, answer_type),
        ):
            values = (
                kind, fresh_request_id(), now, request_id, endpoint, model, version, status,
                body, content_type, traceparent,
            )  # fmt: skip
            if not self.writer.write_later(self._event, values):
                self.metrics.payload_dropped()

    def _event(
        self,
        kind: str,
        event_id: str,
        time: str,
        request_id: str | None,
        endpoint: str,
        model: str | None,
        version: str | None,
        status: int | str,
        body: bytes | Any,
        content_type: str,
        traceparent: str | None,
    ) -> str:
        """One CloudEvent's JSON line (on the writer thread)."""
        event: dict[str, Any] = {
            "specversion": "1.0",
            "id": event_id,
            "source": self.source,
            "type": kind,
            "time": time,
            "requestid": request_id,
            "endpoint": endpoint,
            "model": model,
            "modelversion": version,
            "status": status,
            "traceparent": traceparent,
        }
        if not isinstance(body, bytes):  # a gRPC message
            body = orjson.dumps(json_format.MessageToDict(body))
            content_type = _JSON
        event["datacontenttype"] = content_type
        event["datasize"] = len(body)
        if len(body) > self.max_bytes:
            event["truncated"] = True
        elif content_type.partition(";")[0].strip().lower().endswith("json"):
            try:
                event["data"] = orjson.loads(body)
            except orjson.JSONDecodeError:
                event["data_base64"] = base64.b64encode(body).decode("ascii")
        else:
            event["data_base64"] = base64.b64encode(body).decode("ascii")
        return orjson.dumps({k: v for k, v in event.items() if v is not None}).decode()

    def close(self) -> None:
        """Write what is queued, and close the file."""
        self.writer.close()
        if self._file is not None:
            self._file.close()


def payload_log(settings: Settings, metrics: Metrics) -> PayloadLog | None:
    """The process's payload log, or None when PAYLOAD_LOG_RATE is 0 (nothing is sampled)."""
    return PayloadLog(settings, metrics) if settings.payload_log_rate > 0 else None
