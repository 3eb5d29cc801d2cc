"""The request memory budget and the count of a body's JSON values
(service/api/machinery/limits.py),
against independent references: the values json.loads finds, and the budget's arithmetic."""

from __future__ import annotations

import json
import random
import threading

import pytest
from pydantic import ValidationError

from service.api import Settings
from service.api.errors import MemoryLimitError, RequestTooLargeError
from service.api.machinery.limits import (
    UNCOUNTED_BYTES,
    MemoryBudget,
    RequestHold,
    _value_marks_outside_strings,
    json_values,
)

MARKS = ["\\", '"', ",", ":", "[", "{", "]", "}", "a", " ", "é"]


def _document(rng: random.Random, depth: int = 0):
    kind = rng.random()
    if depth > 4 or kind < 0.3:
        return "".join(rng.choice(MARKS) for _ in range(rng.randint(0, 12)))
    if kind < 0.55:
        return [_document(rng, depth + 1) for _ in range(rng.randint(0, 5))]
    if kind < 0.8:
        keys = ("".join(rng.choice(MARKS) for _ in range(3)) for _ in range(rng.randint(0, 4)))
        return {key: _document(rng, depth + 1) for key in keys}
    return rng.choice([rng.random(), rng.randint(-5, 5), None, True])


def _reference(value) -> tuple[int, int]:
    """Values (object keys included) and empty arrays and objects of a decoded document."""
    if isinstance(value, list):
        counts = [_reference(v) for v in value]
        return 1 + sum(c for c, _ in counts), (not value) + sum(e for _, e in counts)
    if isinstance(value, dict):
        counts = [_reference(v) for v in value.values()]
        return 1 + len(value) + sum(c for c, _ in counts), (not value) + sum(e for _, e in counts)
    return 1, 0


@pytest.mark.parametrize("seed", range(200))
def test_the_count_is_the_values_json_finds_plus_empty_containers(seed, monkeypatch):
    rng = random.Random(seed)
    document = _document(rng)
    raw = json.dumps(document, ensure_ascii=rng.random() < 0.5).encode()
    values, empty = _reference(json.loads(raw))
    # Chunk boundaries anywhere: inside strings, escapes and runs of backslashes.
    monkeypatch.setattr(
        "service.api.machinery.limits._SCAN_CHUNK", rng.choice([1, 2, 3, 7, 64, 4096])
    )
    assert 1 + _value_marks_outside_strings(raw) == values + empty
    assert json_values(raw, 10**9) >= values + empty


def test_a_text_full_of_commas_is_one_value_not_a_million():
    raw = json.dumps({"texts": ["a, b: [c] {d} " * 200_000]}).encode()
    assert json_values(raw, 1024) == 4  # the object, its key, the list, the text
    with pytest.raises(RequestTooLargeError, match="MAX_JSON_VALUES"):
        json_values(json.dumps({"exclude": list(range(2000))}).encode(), 1024)


def test_a_hold_counts_past_its_free_bytes_and_gives_everything_back():
    budget = MemoryBudget(1 << 20)
    first, second = RequestHold(budget), RequestHold(budget)
    first.add(UNCOUNTED_BYTES, "a body")
    assert budget.held == 0
    first.add(600_000, "a body")
    assert budget.held == 600_000
    with pytest.raises(MemoryLimitError, match="MAX_BUFFERED_BYTES"):
        second.add(UNCOUNTED_BYTES + 500_000, "another body")
    assert budget.held == 600_000  # a refusal takes nothing
    with pytest.raises(RequestTooLargeError):
        second.add(2 << 20, "a body larger than the whole budget")
    first.release()
    second.add(UNCOUNTED_BYTES + 500_000, "another body")
    assert budget.held == 500_000
    second.release()
    assert budget.held == 0


def test_the_budget_holds_under_threads():
    budget = MemoryBudget(10_000_000)
    taken = []

    def take():
        for _ in range(1000):
            if budget.take(1000):
                taken.append(1000)

    threads = [threading.Thread(target=take) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(taken) == budget.held == 10_000_000


def test_the_budget_must_hold_two_bodies_of_the_largest_size():
    with pytest.raises(ValidationError, match="at least twice MAX_REQUEST_BYTES"):
        Settings(_env_file=None, max_request_bytes=16 << 20, max_buffered_bytes=24 << 20)
    assert Settings(_env_file=None, max_buffered_bytes=32 << 20).max_buffered_bytes == 32 << 20
