"""The image build's warm-up compiles every similarity driver, grid measures included, and
the search kernel."""

from service.model.similarity import SIMILARITY_KINDS
from service.model.warmup import compile_kernels


def test_warm_up_calls_every_driver_of_every_measure():
    assert compile_kernels() == [*SIMILARITY_KINDS, "search"]
    assert {"rigid", "deformable", "sensing0", "sensing1", "sensing2"} <= set(SIMILARITY_KINDS)
