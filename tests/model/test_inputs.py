"""Input kinds: parsing, and validation of client batches with messages that say what is wrong."""

import math

import numpy as np
import pytest

from service.model import InvalidInputError, SpecError
from service.model.inputs.spec import InputSpec

GRID = InputSpec("grid", (3, 2, 1))


def test_text_form_round_trips():
    for spec in (InputSpec("vector", (64,)), InputSpec("grid", (8, 8, 3))):
        assert InputSpec.parse(str(spec)) == spec
    assert InputSpec.parse(" GRID(8,8, 1) ") == InputSpec("grid", (8, 8, 1))


@pytest.mark.parametrize("text", ["vector()", "grid(8, 8)", "image(3)", "vector(0)", "vector(a)"])
def test_bad_input_kinds_are_refused(text):
    with pytest.raises(SpecError):
        InputSpec.parse(text)


def test_for_array_reads_the_batch_shape():
    assert InputSpec.for_array(np.zeros((5, 7))) == InputSpec("vector", (7,))
    assert InputSpec.for_array(np.zeros((5, 4, 3))) == InputSpec("grid", (4, 3, 1))
    assert InputSpec.for_array(np.zeros((5, 4, 3, 2))) == InputSpec("grid", (4, 3, 2))


def test_grid_batches_accept_full_and_channel_less_shapes_and_flatten_row_major():
    full = np.arange(6.0).reshape(3, 2, 1)
    X = GRID.as_batch([full.tolist(), full[:, :, 0].tolist()])
    assert X.shape == (2, 6)
    assert X.dtype == np.float64
    assert X.flags.c_contiguous
    np.testing.assert_array_equal(X[0], np.arange(6.0))
    np.testing.assert_array_equal(X[1], np.arange(6.0))


def test_integer_arrays_are_accepted():
    X = InputSpec("vector", (3,)).as_batch(np.array([[1, 2, 3]]))
    assert X.dtype == np.float64


@pytest.mark.parametrize(
    ("instances", "message"),
    [
        ([], "the batch is empty"),
        ([[1, 2]], r"instances\[0\] has shape \[2\], expected \[3, 2, 1\] or \[3, 2\]"),
        ([[[1, 2], [3, 4], [5, 6]], [[1, 2], [3, 4]]], r"instances\[1\] has shape \[2, 2\]"),
        ([[[1, 2], [3], [5, 6]]], r"instances\[0\] is ragged"),
        (
            [[["a", "b"], ["c", "d"], ["e", "f"]]],
            r"instances\[0\] must hold only numbers, got strings",
        ),
        ([[[True, False]] * 3], "got booleans"),
        ([[[1, None], [3, 4], [5, 6]]], "got null or mixed values"),
        ([[[1, 2], [3, 4], [5, math.nan]]], r"instances\[0\] contains NaN or infinity"),
        (
            [[[1, 2], [3, 4], [5, 6]], [[1, 2], [3, math.inf], [5, 6]]],
            r"instances\[1\] contains NaN",
        ),
        ([[[1, 2], [3, 4], [5, 10**400]]], r"instances\[0\]"),
        (["not a list"], r"instances\[0\]"),
    ],
)
def test_bad_batches_are_refused_naming_the_instance(instances, message):
    with pytest.raises(InvalidInputError, match=message):
        GRID.as_batch(instances)
