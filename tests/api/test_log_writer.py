"""The background log writer: lines formatted and written off the logging thread, in order,
with the request id read where the line was logged, and every line written by close()."""

from __future__ import annotations

import io
import logging
import threading

from service.api.observability import (
    BackgroundStreamHandler,
    JsonFormatter,
    RequestIdFilter,
    request_scope,
)


def test_lines_keep_their_order_and_ids_and_close_writes_them_all():
    stream = io.StringIO()
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
    assert formatted_on == {"besvm-log-writer"}
