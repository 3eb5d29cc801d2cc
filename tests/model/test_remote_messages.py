"""The one-frame messages a search and its answer travel in between the service and a shard's
actor (``service.model.search.remote``): every field comes back as it went."""

import json

import numpy as np
import pytest

from service.model.search.filters import Filter
from service.model.search.remote import pack_message, unpack_message


def test_a_message_brings_back_its_header_and_arrays_bit_for_bit():
    rng = np.random.default_rng(0)
    atoms = rng.integers(0, 64, size=7)
    weights = rng.standard_normal(7)
    excluded = np.array([], dtype=np.int64)
    after = [float(rng.standard_normal()) / 3.0, 12345]
    query = {"must": [{"key": "source", "match": {"value": "scan"}}],
             "should": [{"key": "year", "range": {"gte": 2015.5}}]}  # fmt: skip
    header = {"version": "ab" * 32, "k": 20, "after": after, "ids": ["7", "é", ""],
              "filter": json.loads(Filter.parse(query).canonical())}  # fmt: skip
    message = pack_message(header, [atoms, weights, excluded, np.arange(3, dtype=np.uint64)])
    assert isinstance(message, bytes)

    back, arrays = unpack_message(message)
    assert back == header  # the cursor's score exactly: JSON floats round-trip
    assert Filter.parse(back["filter"]) == Filter.parse(query)
    for sent, received in zip([atoms, weights, excluded, np.arange(3, dtype=np.uint64)], arrays,
                              strict=True):  # fmt: skip
        assert received.dtype == sent.dtype
        np.testing.assert_array_equal(received, sent)


@pytest.mark.parametrize("array", [np.arange(6).reshape(2, 3)[:, ::2], np.float32([1.5, -2.0])])
def test_strided_and_narrow_arrays_travel_as_they_are(array):
    (_, (received,)) = unpack_message(pack_message({}, [array.ravel()]))
    np.testing.assert_array_equal(received, array.ravel())
    assert received.dtype == array.dtype
