"""Input transforms: what the service computes from a raw instance before anything else.

A model records its transform in the manifest, so clients send raw inputs (for images, the
pixels) and never compute features themselves. Written like similarity measures:

- ``none``: the instance as it is (any input kind);
- ``pixels``: an image as a grid of pixel cells, 1 (grey) or 3 (colour) numbers per cell;
- ``hog(cell_size, orientations)``: an image as a grid of HOG cells, ``orientations`` gradient
  histogram bins per ``cell_size x cell_size`` pixel cell, each cell L2-Hys normalised on its
  own (scikit-image's HOG with one-cell blocks, computed by :mod:`service.model.kernels.hog`
  with the same numbers), so grid similarities can shift whole cells.
- ``bof(patch, step, words, levels, single)``: an image as bags of visual words on a spatial
  pyramid (the sensing-kernel paper's scenes, section 5): a SIFT-like descriptor of every
  ``patch x patch`` patch, every ``step`` pixels, becomes the nearest of ``words`` centres
  learned by k-means on the training images, and each cell of levels 0..``levels``
  (``2^l x 2^l`` cells; with ``single=1`` level ``levels`` alone) counts its words. It is
  *fitted*: the model stores the centres (see :mod:`service.model.inputs.bof`), and its output
  is word counts, which the documents measures read cell by cell, not a dense vector.
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

TRANSFORMS = ("none", "pixels", "hog", "bof")
_PARAMETERS = {
    "none": (),
    "pixels": (),
    "hog": (("cell_size", 4), ("orientations", 9)),
    "bof": (("patch", 16), ("step", 8), ("words", 400), ("levels", 2), ("single", 0)),
}
_MAY_BE_ZERO = frozenset({"levels", "single"})
# A descriptor's 4 x 4 spatial bins (SIFT's layout): a patch is a multiple of 4 pixels.
BOF_SPATIAL_BINS = 4
# The finest pyramid level a bof transform may ask for: 4^5 = 1,024 cells at level 5.
BOF_MAX_LEVEL = 5


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

    @property
    def is_fitted(self) -> bool:
        """Learned from the training set (``bof``'s visual words): the model stores what it
        learned beside the transform's text, and :meth:`bind` does not apply; see
        :mod:`service.model.inputs.bof`."""
        return self.name == "bof"

    @property
    def reads_cells(self) -> bool:
        """Its output is word counts per pyramid cell (``bof``), which the measures with
        drivers on cells read (:attr:`service.model.similarity.SimilarityKind.cells`)."""
        return self.name == "bof"

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
        height, width, _ = input_spec.shape
        if self.name == "hog":
            cell = dict(self.params)["cell_size"]
            if cell > min(height, width):
                raise SpecError(
                    f"transform {self}: cell_size {cell} is larger than the {height}x{width} image"
                )
        if self.name == "bof":
            self._check_bof(height, width)

    def _check_bof(self, height: int, width: int) -> None:
        params = dict(self.params)
        patch, step = params["patch"], params["step"]
        if patch % BOF_SPATIAL_BINS:
            raise SpecError(
                f"transform {self}: patch must be a multiple of {BOF_SPATIAL_BINS} pixels "
                f"({BOF_SPATIAL_BINS} x {BOF_SPATIAL_BINS} spatial bins), got {patch}"
            )
        bin_size = patch // BOF_SPATIAL_BINS
        if step % bin_size:
            raise SpecError(
                f"transform {self}: step must be a multiple of a spatial bin, patch / "
                f"{BOF_SPATIAL_BINS} = {bin_size} pixels, got {step}"
            )
        if patch > min(height, width):
            raise SpecError(
                f"transform {self}: patch {patch} is larger than the {height}x{width} image"
            )
        if params["words"] < 2:
            raise SpecError(f"transform {self}: a vocabulary needs at least 2 words")
        if params["levels"] > BOF_MAX_LEVEL:
            raise SpecError(f"transform {self}: levels must be 0..{BOF_MAX_LEVEL}")
        if params["single"] not in (0, 1):
            raise SpecError(f"transform {self}: single is 0 (the pyramid) or 1 (one level)")

    def bof_geometry(self, input_spec: InputSpec) -> tuple[int, int, int, int]:
        """For ``bof``: the spatial bin in pixels, the step in bins, and the patches per column
        and per row of an image of ``input_spec``."""
        self.check(input_spec)
        params = dict(self.params)
        bin_size = params["patch"] // BOF_SPATIAL_BINS
        step_bins = params["step"] // bin_size
        height, width, _ = input_spec.shape
        rows = (height // bin_size - BOF_SPATIAL_BINS) // step_bins + 1
        cols = (width // bin_size - BOF_SPATIAL_BINS) // step_bins + 1
        return bin_size, step_bins, rows, cols

    def bof_levels(self) -> tuple[int, ...]:
        """For ``bof``: the pyramid levels whose cells it counts."""
        params = dict(self.params)
        top = params["levels"]
        return (top,) if params["single"] else tuple(range(top + 1))

    def bof_cells(self) -> int:
        """For ``bof``: the cells of every level it counts (4^l at level l)."""
        return sum(4**level for level in self.bof_levels())

    def grid_shape(self, input_spec: InputSpec) -> tuple[int, int, int] | None:
        """Layout of the transformed instance as (height, width, channels), or None if flat."""
        self.check(input_spec)
        if self.name == "none":
            return tuple(input_spec.shape) if input_spec.kind == "grid" else None
        if self.name == "bof":
            return None
        if self.name == "pixels":
            return tuple(input_spec.shape)
        params = dict(self.params)
        height, width, _ = input_spec.shape
        cell = params["cell_size"]
        return (height // cell, width // cell, params["orientations"])

    def n_features(self, input_spec: InputSpec) -> int:
        """Length of a transformed instance (``bof``: cells times words)."""
        if self.name == "bof":
            self.check(input_spec)
            return self.bof_cells() * dict(self.params)["words"]
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
            The transform does not apply to the inputs, or is fitted (``bof``: bind its
            fitted form, :class:`service.model.inputs.bof.BagOfFeatures`).
        """
        if self.is_fitted:
            raise SpecError(f"transform {self} is fitted on training images: it needs its words")
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
    """Parse ``none``, ``pixels``, ``hog``, ``hog(4)``, ``hog(cell_size=4, orientations=9)``,
    ``bof`` or ``bof(patch=16, step=8, words=400, levels=2, single=0)``.

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
        smallest = 0 if key in _MAY_BE_ZERO else 1
        if values[key] < smallest:
            raise SpecError(f"{name}: parameter {key} must be >= {smallest}, got {values[key]}")
    return InputTransform(name, tuple((k, values.get(k, v)) for k, v in defaults.items()))


def default_transform(input_spec: InputSpec) -> InputTransform:
    """``pixels`` for images, ``none`` for everything else."""
    if input_spec.kind == "grid" and input_spec.shape[2] in (1, 3):
        return InputTransform("pixels")
    return InputTransform("none")
