"""Input transforms: what the service computes from a raw instance before anything else.

A model records its transform in the manifest, so clients send raw inputs (for images, the
pixels) and never compute features themselves. Written like similarity measures:

- ``none``: the instance as it is (any input kind);
- ``pixels``: an image as a grid of pixel cells, 1 (grey) or 3 (colour) numbers per cell;
- ``hog(cell_size, orientations)``: an image as a grid of HOG cells, ``orientations`` gradient
  histogram bins per ``cell_size x cell_size`` pixel cell, each cell L2-Hys normalised on its
  own (scikit-image's HOG with one-cell blocks, computed by :mod:`service.model.kernels.hog`
  with the same numbers), so grid similarities can shift whole cells.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numba
import numpy as np

from service.model import threads
from service.model.errors import SpecError
from service.model.inputs.spec import InputSpec
from service.model.kernels import hog as hog_kernels
from service.model.notation import bind_arguments, parse_call

TRANSFORMS = ("none", "pixels", "hog")
_PARAMETERS = {"none": (), "pixels": (), "hog": (("cell_size", 4), ("orientations", 9))}


@dataclass(frozen=True)
class InputTransform:
    """A transform with all of its parameters set.

    Parameters
    ----------
    name : {"none", "pixels", "hog"}
    params : tuple of (str, int)
        Every parameter of the transform, in order.
    """

    name: str
    params: tuple[tuple[str, int], ...] = ()

    def __str__(self) -> str:
        if not self.params:
            return self.name
        return f"{self.name}({', '.join(f'{k}={v}' for k, v in self.params)})"

    @property
    def is_identity(self) -> bool:
        return self.name in ("none", "pixels")

    def check(self, input_spec: InputSpec) -> None:
        """Refuse a transform that does not apply to the model's inputs.

        Raises
        ------
        SpecError
        """
        if self.name == "none":
            return
        if input_spec.kind != "grid" or input_spec.shape[2] not in (1, 3):
            raise SpecError(
                f"transform {self} needs images (grid(H, W, 1) or grid(H, W, 3)),"
                f" the inputs are {input_spec}"
            )
        if self.name == "hog":
            cell = dict(self.params)["cell_size"]
            height, width, _ = input_spec.shape
            if cell > min(height, width):
                raise SpecError(
                    f"transform {self}: cell_size {cell} is larger than the {height}x{width} image"
                )

    def grid_shape(self, input_spec: InputSpec) -> tuple[int, int, int] | None:
        """Layout of the transformed instance as (height, width, channels), or None if flat."""
        self.check(input_spec)
        if self.name == "none":
            return tuple(input_spec.shape) if input_spec.kind == "grid" else None
        if self.name == "pixels":
            return tuple(input_spec.shape)
        params = dict(self.params)
        height, width, _ = input_spec.shape
        cell = params["cell_size"]
        return (height // cell, width // cell, params["orientations"])

    def n_features(self, input_spec: InputSpec) -> int:
        """Length of a transformed instance."""
        shape = self.grid_shape(input_spec)
        return input_spec.n_features if shape is None else int(np.prod(shape))

    def apply(self, X: np.ndarray, input_spec: InputSpec) -> np.ndarray:
        """Transform a validated batch (checking the transform against ``input_spec`` first;
        callers that transform many batches :meth:`bind` once).

        Parameters
        ----------
        X : ndarray of shape (n_samples, input_spec.n_features)
            Flat raw instances, as :meth:`InputSpec.as_batch` returns them.
        input_spec : InputSpec

        Returns
        -------
        ndarray of shape (n_samples, n_features(input_spec)), float64, C-contiguous
        """
        return self.bind(input_spec).apply(X)

    def bind(self, input_spec: InputSpec) -> BoundTransform:
        """This transform checked against ``input_spec`` once, its output layout resolved.

        Raises
        ------
        SpecError
            The transform does not apply to the inputs.
        """
        grid_shape = self.grid_shape(input_spec)
        n_features = input_spec.n_features if grid_shape is None else int(np.prod(grid_shape))
        return BoundTransform(self, input_spec, grid_shape, n_features)


@dataclass(frozen=True)
class BoundTransform:
    """A transform bound to the inputs it reads (see :meth:`InputTransform.bind`): the checks
    and the output layout are settled, :meth:`apply` only computes.

    Parameters
    ----------
    transform : InputTransform
    input_spec : InputSpec
    grid_shape : (height, width, channels) or None
        Layout of a transformed instance; None if flat.
    n_features : int
        Length of a transformed instance.
    """

    transform: InputTransform
    input_spec: InputSpec
    grid_shape: tuple[int, int, int] | None
    n_features: int

    def apply(self, X: np.ndarray) -> np.ndarray:
        """Transform a validated batch.

        Parameters
        ----------
        X : ndarray of shape (n_samples, input_spec.n_features)
            Flat raw instances, as :meth:`InputSpec.as_batch` returns them.

        Returns
        -------
        ndarray of shape (n_samples, n_features), float64, C-contiguous
            ``hog``: each row equals scikit-image's ``hog(...).ravel()`` of its image (see
            :mod:`service.model.kernels.hog`).
        """
        if self.transform.is_identity:
            return X
        X = np.ascontiguousarray(X, dtype=np.float64)
        out = np.empty((X.shape[0], self.n_features))
        driver = self.hog_driver_for(X.shape[0])
        params = dict(self.transform.params)
        args = (*self.input_spec.shape, int(params["cell_size"]), int(params["orientations"]))
        if driver is hog_kernels.hog_cells:
            with threads.PARALLEL_REGION:
                driver(X, *args, out)
        else:
            driver(X, *args, out)
        return out

    def runs_serially(self, n_samples: int) -> bool:
        """Whether :meth:`apply` to ``n_samples`` inputs is light work on the calling thread:
        no parallel region, so no wait for :data:`service.model.threads.PARALLEL_REGION` (what
        the service's data plane needs to know before it runs work on its event loop)."""
        values = n_samples * self.input_spec.n_features
        return self.transform.is_identity or values < threads.HOG_PARALLEL_MIN_VALUES

    def hog_driver_for(self, n_samples: int) -> Callable[..., None]:
        """The HOG driver for ``n_samples`` images: the serial one below
        :data:`service.model.threads.HOG_PARALLEL_MIN_VALUES` pixel values or with one numba
        thread, else the parallel one (called under
        :data:`service.model.threads.PARALLEL_REGION`)."""
        if self.runs_serially(n_samples) or numba.get_num_threads() < 2:
            return hog_kernels.hog_cells_serial
        return hog_kernels.hog_cells


def parse_transform(text: str | None) -> InputTransform:
    """Parse ``none``, ``pixels``, ``hog``, ``hog(4)`` or ``hog(cell_size=4, orientations=9)``.

    Raises
    ------
    SpecError
    """
    text = text or "none"
    name, arguments = parse_call(text, "transform")
    if name not in TRANSFORMS:
        raise SpecError(f"unknown transform {name!r}; known: {', '.join(TRANSFORMS)}")
    defaults = dict(_PARAMETERS[name])
    values: dict[str, int] = {}
    for key, raw in bind_arguments(name, arguments, list(defaults), text).items():
        try:
            values[key] = int(raw)
        except ValueError:
            raise SpecError(f"{name}: parameter {key} must be an integer, got {raw!r}") from None
        if values[key] < 1:
            raise SpecError(f"{name}: parameter {key} must be >= 1, got {values[key]}")
    return InputTransform(name, tuple((k, values.get(k, v)) for k, v in defaults.items()))


def default_transform(input_spec: InputSpec) -> InputTransform:
    """``pixels`` for images, ``none`` for everything else."""
    if input_spec.kind == "grid" and input_spec.shape[2] in (1, 3):
        return InputTransform("pixels")
    return InputTransform("none")
