"""Fitting a ``bof`` transform: the visual words of images as bags of visual words.

The sensing-kernel paper (section 5.1, after Lazebnik et al.): ``D`` patches are drawn from the
training images, their descriptors clustered by k-means into ``W`` centres, the visual words.
Here the descriptors are those of every patch of a seeded sample of training images, at most
:data:`MAX_DESCRIPTORS` of them, clustered by scikit-learn's ``MiniBatchKMeans`` with the same
seed; then the idf of each word over the cells of every training image (the tf-idf view that
``linear`` and ``rbf`` read). What is learned is two plain arrays, which the artifact stores
(:class:`service.model.inputs.bof.BagOfFeatures`).
"""

from __future__ import annotations

import numpy as np
from sklearn.cluster import MiniBatchKMeans

from service.model.inputs.bof import DESCRIPTOR_LENGTH, BagOfFeatures, PyramidLayout
from service.model.inputs.spec import InputSpec
from service.model.inputs.transforms import InputTransform
from service.model.inputs.words import CellDocuments, smooth_idf

# Descriptors k-means clusters at most (the paper's D): about 2,000 images of 64 x 64 pixels at
# the default patch and step (49 patches each). More add seconds, not words.
MAX_DESCRIPTORS = 100_000


def fit_bag_of_features(
    transform: InputTransform,
    spec: InputSpec,
    X: np.ndarray,
    random_state: int | None = 0,
    max_descriptors: int = MAX_DESCRIPTORS,
) -> tuple[BagOfFeatures, CellDocuments]:
    """Learn the visual words of ``transform`` on training images, and give the images as bags
    of visual words.

    Parameters
    ----------
    transform : InputTransform
        A ``bof`` transform.
    spec : InputSpec
        The images, ``grid(H, W, C)``.
    X : ndarray of shape (n_samples, spec.n_features)
        Flat raw training images.
    random_state : int or None, default=0
        Seeds the sample of images and k-means.
    max_descriptors : int, default=MAX_DESCRIPTORS
        Descriptors clustered at most.

    Returns
    -------
    bag : BagOfFeatures
    items : CellDocuments
        The training images as bags of visual words (with the idf).

    Raises
    ------
    ValueError
        Fewer descriptors (patches of the training images) than words, or training images
        whose descriptors cannot be computed (values too large).
    """
    layout = PyramidLayout.of(transform, spec)
    n_words = int(dict(transform.params)["words"])
    n_images = min(len(X), max(1, max_descriptors // layout.n_patches))
    rng = np.random.default_rng(random_state)
    sample = np.sort(rng.choice(len(X), size=n_images, replace=False))
    unfitted = BagOfFeatures(transform, np.zeros((n_words, DESCRIPTOR_LENGTH)), np.ones(n_words))
    descriptors = unfitted.bind(spec).descriptors(X[sample]).reshape(-1, DESCRIPTOR_LENGTH)
    if not np.isfinite(descriptors).all():
        raise ValueError(
            f"transform {transform}: training images hold values too large for the descriptors"
        )
    if len(descriptors) < n_words:
        raise ValueError(
            f"transform {transform}: {len(descriptors)} patches in the training images, fewer "
            f"than the {n_words} words asked for"
        )
    # OpenMP threads, as many as the caller's limit_threads allows (the estimator's n_jobs)
    kmeans = MiniBatchKMeans(
        n_clusters=n_words,
        random_state=random_state,
        batch_size=max(1024, 2 * n_words),
        n_init=3,
    ).fit(descriptors)
    centres = kmeans.cluster_centers_
    bound = BagOfFeatures(transform, centres, np.ones(n_words)).bind(spec)
    words, finite = bound.words(X)
    if not finite.all():
        raise ValueError(
            f"transform {transform}: training images hold values too large for the descriptors"
        )
    bag = BagOfFeatures(transform, centres, smooth_idf(bound.cells_of(words).documents.counts))
    return bag, bag.bind(spec).cells_of(words)
