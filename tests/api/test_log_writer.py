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

from service.api.observability import (
    BackgroundStreamHandler,
    JsonFormatter,
    RequestIdFilter,
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
