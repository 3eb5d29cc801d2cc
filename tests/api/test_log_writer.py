"""The background log writer: lines formatted where they are logged (no record is held) and
written off the logging thread, in order, with the request id read where the line was logged,
and every line written by close()."""

from __future__ import annotations

import datetime
import io
import json
import logging
import random
import threading

from service.api.machinery.observability import (
    BackgroundStreamHandler,
    JsonFormatter,
    RequestIdFilter,
    log_access,
    request_scope,
)


class _Stream(io.StringIO):
    """Records the threads that write to it."""

    def __init__(self) -> None:
        super().__init__()
        self.writers: set[str] = set()

    def write(self, text: str) -> int:
        self.writers.add(threading.current_thread().name)
        return super().write(text)


def test_lines_keep_their_order_and_ids_and_close_writes_them_all():
    stream = _Stream()
    handler = BackgroundStreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(RequestIdFilter())
    logger = logging.getLogger("tests.log_writer")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    formatted_on: set[str] = set()
    format_record = handler.format

    def spy(record):
        formatted_on.add(threading.current_thread().name)
        return format_record(record)

    handler.format = spy
    try:
        for i in range(2000):
            with request_scope(f"req-{i}"):
                logger.info("line %d", i)
    finally:
        logger.removeHandler(handler)
        handler.close()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2000
    assert [line.split('"message":"')[1].split('"')[0] for line in lines] == [
        f"line {i}" for i in range(2000)
    ]
    assert all(f'"request_id":"req-{i}"' in line for i, line in enumerate(lines))
    assert formatted_on == {threading.current_thread().name}
    assert stream.writers == {"besvm-log-writer"}


def test_json_timestamps_are_those_of_datetime():
    formatter = JsonFormatter()
    rng = random.Random(0)
    edges = [0.0, 0.0005, 0.0000005, 0.9995, 0.9999995, 0.9999996]
    moments = [rng.uniform(1.7e9, 1.8e9) for _ in range(20000)]
    moments += [rng.randint(1_700_000_000, 1_800_000_000) + edge for edge in edges * 500]
    for moment in moments:
        record = logging.LogRecord("x", logging.INFO, "", 0, "m", (), None)
        record.created = moment
        expected = datetime.datetime.fromtimestamp(moment, datetime.UTC)
        assert json.loads(formatter.format(record))["ts"] == expected.isoformat(
            timespec="milliseconds"
        )


def _access_lines(extra_handler: logging.Handler | None) -> tuple[list[dict], int]:
    """Three access lines written through the server's handler (the second one's key set, the
    third with an odd path, a quoted client and a key), with ``extra_handler`` on the way if
    given, as JSON without their timestamps; and how many records the handler formatted."""
    stream = _Stream()
    handler = BackgroundStreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    records = []
    format_record = handler.format
    handler.format = lambda record: records.append(record) or format_record(record)
    handler.addFilter(RequestIdFilter())
    logger = logging.getLogger("service")
    saved = logger.handlers[:], logger.level, logger.propagate
    logger.handlers[:] = [handler] + ([extra_handler] if extra_handler else [])
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        with request_scope("req-a"):
            log_access("POST", "/classify", 200, 0.0012345, "127.0.0.1:5000")
        with request_scope("req-b"):
            log_access("GRPC", "/inference.GRPCInferenceService/ModelInfer", "OK", 2.5, None,
                       key="sha256:ab12")  # fmt: skip
            log_access("GET", "/readyz", 200, 0.001, None)  # a probe: debug, not written
        with request_scope("req-c"):
            # What JSON must escape, and a path past the logged length.
            log_access("GET", ODD_PATH, 404, 123.4567894, '10.0.0.1:1 "x"', key="0f1e2d3c")
    finally:
        logger.handlers[:], level, logger.propagate = saved[0], saved[1], saved[2]
        logger.setLevel(level)
        handler.close()
    # Lines end at \n only: JSON may hold U+2028, which splitlines() would also cut at.
    lines = [json.loads(line) for line in stream.getvalue().split("\n")[:-1]]
    for line in lines:
        datetime.datetime.fromisoformat(line.pop("ts"))
    return lines, len(records)


ODD_PATH = '/v1/models/"\\/\n\t\x00\u00e9\u2028\U0001f600/' + "x" * 2000


def test_an_access_line_written_directly_is_the_line_logging_writes():
    direct, records = _access_lines(None)
    assert records == 0  # no LogRecord made
    through_logging, records = _access_lines(logging.NullHandler())  # not the sole handler
    assert records == 3
    assert direct == through_logging
    assert [list(line) for line in direct] == [list(line) for line in through_logging]  # order
    odd = direct.pop()
    assert odd["path"] == ODD_PATH[:1024]
    assert odd["duration_ms"] == 123456.789
    assert odd["message"] == f'10.0.0.1:1 "x" "GET {ODD_PATH[:1024]}" 404 123456.789 ms'
    assert direct == [
        {"level": "info", "logger": "service.api.access",
         "message": '127.0.0.1:5000 "POST /classify" 200 1.234 ms', "request_id": "req-a",
         "method": "POST", "path": "/classify", "status": 200, "duration_ms": 1.234,
         "client": "127.0.0.1:5000"},
        {"level": "info", "logger": "service.api.access",
         "message": 'None "GRPC /inference.GRPCInferenceService/ModelInfer" OK 2500.000 ms',
         "request_id": "req-b", "method": "GRPC",
         "path": "/inference.GRPCInferenceService/ModelInfer", "status": "OK",
         "duration_ms": 2500.0, "client": None, "key": "sha256:ab12"},
    ]  # fmt: skip
