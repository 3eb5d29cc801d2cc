r"""The memory arithmetic of a fit: how much memory this machine has available
(:func:`available_memory_bytes`), the default budget for the training features
(:func:`default_memory_budget`), what the features of n items take (:func:`feature_bytes`), and
the largest basis that fits a budget (:func:`features_within`, :func:`basis_per_class_within`,
which counts a class smaller than the basis per class at its size: :func:`basis_per_class_holding`).

The training features are an n x F matrix of float64 numbers (F = basis items x features per
basis item). Beside them every fit keeps the basis Gram matrix, and the nystroem normalisations
add its eigenvectors and the projection made of them: s F x F matrices, s = 3 under nystroem and
1 under the others (:func:`square_matrices`). A budget of b bytes thus holds F features of n items
when

.. math::

    8 (n F + s F^2) \le b.

The selection sizes the final fit's basis with it (:mod:`training.selection.space`) and so does
the basis ladder (:mod:`training.selection.basis_ladder`); the ``fit`` command parses
``--memory-budget`` with :func:`parse_bytes` and states what the default allows
(:func:`default_allowance`).
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

import numpy as np

__all__ = [
    "FALLBACK_AVAILABLE_BYTES",
    "FEATURE_ITEMSIZE",
    "GRAM_MATRICES",
    "MEMORY_SHARE",
    "NYSTROEM_SQUARE_MATRICES",
    "available_memory_bytes",
    "basis_per_class_holding",
    "basis_per_class_within",
    "default_allowance",
    "default_memory_budget",
    "describe_bytes",
    "feature_bytes",
    "features_within",
    "parse_bytes",
    "square_matrices",
]

# The share of the memory available when a fit starts that its training features may take by
# default: the rest holds the inputs, the solver's working vectors (a few n-vectors per class and,
# for the exact Newton method, an F x F Hessian per thread) and everything else running.
MEMORY_SHARE = 0.25

# Where neither /proc/meminfo nor the platform says how much memory is available.
FALLBACK_AVAILABLE_BYTES = 4 * 2**30

# Bytes of one feature value: the expansion writes, and the solver reads, float64.
FEATURE_ITEMSIZE = 8

# The F x F matrices a fit holds beside its features: the basis Gram matrix under every
# normalisation (the expansion keeps it: the artifact's eigenvalue report reads it), and under
# nystroem also its eigenvectors (a kernel's clip map: its Cholesky factor) and the projection
# made of them. Counted as F x F where they are
# one B x B matrix per measure (F = M B), so the bound errs small for joined measures.
GRAM_MATRICES = 1
NYSTROEM_SQUARE_MATRICES = 3

MEMINFO = Path("/proc/meminfo")

# /proc/meminfo's "kB" is 1,024 bytes (proc(5)).
MEMINFO_UNIT = 2**10

_UNITS = {
    "": 1,
    "b": 1,
    "k": 2**10,
    "kib": 2**10,
    "kb": 10**3,
    "m": 2**20,
    "mib": 2**20,
    "mb": 10**6,
    "g": 2**30,
    "gib": 2**30,
    "gb": 10**9,
    "t": 2**40,
    "tib": 2**40,
    "tb": 10**12,
}

_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*)\s*$", re.IGNORECASE)


# Where a container's memory limit and use are: cgroup v2 files, then v1's.
CGROUP = Path("/sys/fs/cgroup")

CGROUP_LIMITS = (
    ("memory.max", "memory.current"),
    ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes"),
)


def cgroup_headroom_bytes(cgroup: Path = CGROUP) -> int | None:
    """What this process's memory cgroup (a container's limit, compose's ``mem_limit``) leaves:
    its limit less its use, or None where no limit is set or readable. ``/proc/meminfo`` says
    the host's memory, not the container's.

    Parameters
    ----------
    cgroup : Path, default=/sys/fs/cgroup
        The cgroup file system's mount.
    """
    for limit_file, usage_file in CGROUP_LIMITS:
        try:
            limit = (cgroup / limit_file).read_text().strip()
            usage = int((cgroup / usage_file).read_text().strip())
        except (OSError, ValueError):
            continue
        # v2 says "max" for none; v1 a number near 2**63
        if limit == "max" or not limit.isdigit() or int(limit) >= 2**60:
            return None
        return max(0, int(limit) - usage)
    return None


def available_memory_bytes(meminfo: Path = MEMINFO, cgroup: Path = CGROUP) -> int:
    """Memory a new allocation can have now without swapping: Linux's ``MemAvailable`` (free
    memory and the page cache the kernel gives back), else the platform's free pages
    (``SC_AVPHYS_PAGES``, which leaves the cache out), else :data:`FALLBACK_AVAILABLE_BYTES`;
    at most what the memory cgroup's limit leaves (:func:`cgroup_headroom_bytes`).

    Parameters
    ----------
    meminfo : Path, default=/proc/meminfo
        Where Linux says it.
    cgroup : Path, default=/sys/fs/cgroup
        Where a container's limit is.

    Returns
    -------
    int
        Bytes.
    """
    headroom = cgroup_headroom_bytes(cgroup)
    available = _machine_available_bytes(meminfo)
    return available if headroom is None else min(available, headroom)


def _machine_available_bytes(meminfo: Path) -> int:
    try:
        for line in meminfo.read_text().splitlines():
            name, _, value = line.partition(":")
            if name == "MemAvailable":
                number, unit = value.split()
                if unit != "kB":
                    raise ValueError(f"MemAvailable in {unit!r}")
                return int(number) * MEMINFO_UNIT
    except (OSError, ValueError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return FALLBACK_AVAILABLE_BYTES


# How the record and the help name the default budget's rule.
DEFAULT_BUDGET_RULE = f"{MEMORY_SHARE:.0%} of the memory available at the start"


def default_memory_budget(available_bytes: int | None = None) -> int:
    """:data:`MEMORY_SHARE` of ``available_bytes`` (None: :func:`available_memory_bytes`)."""
    available = available_memory_bytes() if available_bytes is None else available_bytes
    return int(MEMORY_SHARE * available)


def square_matrices(normalization: str) -> int:
    """The F x F matrices a fit under ``normalization`` (canonical, ``auto`` resolved:
    :func:`service.model.features.resolve_normalization`) holds beside its features:
    :data:`NYSTROEM_SQUARE_MATRICES` under ``nystroem(...)``, :data:`GRAM_MATRICES` under the
    per-feature affine ones (``besvm``, ``zscore``, ``none``)."""
    return NYSTROEM_SQUARE_MATRICES if normalization.startswith("nystroem") else GRAM_MATRICES


def feature_bytes(n_items: int, n_features: int, squares: int = NYSTROEM_SQUARE_MATRICES) -> int:
    """Bytes of the training features of ``n_items`` items and ``n_features`` features: the
    n x F matrix and ``squares`` F x F ones (:func:`square_matrices`; by default nystroem's,
    the most), of :data:`FEATURE_ITEMSIZE` bytes a number."""
    return FEATURE_ITEMSIZE * (n_items * n_features + squares * n_features**2)


def features_within(
    n_items: int, budget_bytes: int, squares: int = NYSTROEM_SQUARE_MATRICES
) -> int:
    """The most features F of ``n_items`` items whose :func:`feature_bytes` (with ``squares``
    F x F matrices) fit ``budget_bytes`` (0 when not even one does).

    Raises
    ------
    ValueError
        ``n_items`` below 1: features of no items take no memory, and no count is the most."""
    if n_items < 1:
        raise ValueError(f"the features of {n_items} items: at least one item is needed")
    # The positive root of squares F^2 + n F - budget / itemsize = 0, then corrected by a step
    # for the root's rounding.
    numbers = budget_bytes / FEATURE_ITEMSIZE
    if squares:
        root = (-n_items + math.sqrt(n_items**2 + 4 * squares * numbers)) / (2 * squares)
    else:
        root = numbers / n_items
    features = max(0, int(root))
    while features > 0 and feature_bytes(n_items, features, squares) > budget_bytes:
        features -= 1
    while feature_bytes(n_items, features + 1, squares) <= budget_bytes:
        features += 1
    return features


def basis_items(per_class: int, class_counts) -> int:
    r"""The items of a basis of ``per_class`` a class: :math:`\sum_c \min(k, n_c)`, a class
    smaller than k giving every item it has.

    Parameters
    ----------
    per_class : int
        The basis per class, k.
    class_counts : array-like of int, shape (n_classes,)
        Items of each class, n_c.

    Returns
    -------
    int
        The basis's items: at most every item.
    """
    return int(np.minimum(np.ravel(np.asarray(class_counts)), per_class).sum())


def basis_per_class_holding(most_items: float, class_counts) -> int:
    """The largest basis per class whose basis (:func:`basis_items`) fits ``most_items`` items
    (at least 1).

    Parameters
    ----------
    most_items : float
        The most basis items.
    class_counts : array-like of int, shape (n_classes,)
        Items of each class, n_c.

    Returns
    -------
    int
        At most the largest class: past it the basis is every item.
    """
    if not math.isfinite(most_items):
        raise ValueError(f"the most basis items must be a finite number, got {most_items!r}")
    counts = np.sort(np.ravel(np.asarray(class_counts)).astype(np.int64))
    if counts.size == 0:
        raise ValueError("no classes: a basis per class needs at least one")
    below = 0  # items of the classes already given whole
    for taken, count in enumerate(counts):
        # k at least the classes before this one: each class from here on gives k items. Where
        # k reaches this class's count the class is whole, and the next ones may give more.
        per_class = (most_items - below) // (counts.size - taken)
        if per_class < count:
            return max(1, int(per_class))
        below += int(count)
    return int(counts[-1])


def basis_per_class_within(
    class_counts,
    features_per_basis_item: float,
    budget_bytes: int,
    squares: int = NYSTROEM_SQUARE_MATRICES,
) -> int:
    """The largest basis per class whose training features fit ``budget_bytes`` (at least 1).

    Parameters
    ----------
    class_counts : array-like of int, shape (n_classes,)
        Training items of each class, the features' rows: a class smaller than the basis per
        class gives every item it has, so unbalanced classes hold a larger basis per class.
    features_per_basis_item : float
        Features per basis item: the measures' weight
        (:func:`~training.selection.space.basis_weight`, 1 for an rbf), which is at least their
        number, so that a costly measure's basis is bounded as its work is.
    budget_bytes : int
    squares : int, default=NYSTROEM_SQUARE_MATRICES
        F x F matrices held beside the features: :func:`square_matrices` of the normalisation.

    Returns
    -------
    int
        At most the largest class (every item).
    """
    features = features_within(int(np.sum(class_counts)), budget_bytes, squares)
    return basis_per_class_holding(features / max(features_per_basis_item, 1e-9), class_counts)


def parse_bytes(text: str) -> int:
    """A size in bytes from text: a number with an optional unit, ``8GiB``, ``500MiB``, ``8GB``
    (10^9), ``8G`` (2^30, as ``GiB``), ``4000000000``; units are case-insensitive.

    Raises
    ------
    ValueError
        Not such a size, or not at least one byte.
    """
    match = _SIZE.match(str(text))
    if match is None or match.group(2).lower() not in _UNITS:
        raise ValueError(
            f"{text!r} is not a size: give bytes as a number with an optional unit, e.g. "
            "8GiB, 500MiB, 8GB or 4000000000"
        )
    size = int(float(match.group(1)) * _UNITS[match.group(2).lower()])
    if size < 1:
        raise ValueError(f"{text!r}: a memory budget must be at least one byte")
    return size


def describe_bytes(size: float) -> str:
    """``size`` bytes in words: ``8.0 GiB``, ``512.0 MiB``, ``100 B``."""
    for unit, factor in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= factor:
            return f"{size / factor:.1f} {unit}"
    return f"{int(size)} B"


def default_allowance(
    n_items: tuple[int, ...] = (10**4, 10**5, 10**6),
    n_classes: int = 10,
    features_per_basis_item: float = 1.0,
    budget_bytes: int | None = None,
) -> str:
    """What ``budget_bytes`` (None: :func:`default_memory_budget` now) allows, in words: the
    basis items per class at each of ``n_items`` training items, for ``n_classes`` classes and
    measures of ``features_per_basis_item`` (an rbf: 1)."""
    budget = default_memory_budget() if budget_bytes is None else budget_bytes
    sizes = []
    for i, n in enumerate(n_items):
        counts = [n // n_classes + (c < n % n_classes) for c in range(n_classes)]
        per_class = basis_per_class_within(counts, features_per_basis_item, budget)
        sizes.append(
            f"{per_class:,} "
            + ("basis items a class at " if i == 0 else "at ")
            + f"{n:,}"
            + (" training items" if i == 0 else "")
            + (" (every item)" if per_class == max(counts) else "")
        )
    measure = (
        "an rbf"
        if features_per_basis_item == 1
        else f"{features_per_basis_item:g} features a basis item"
    ) + " under nystroem; more under besvm"
    return (
        f"{describe_bytes(budget)}, which holds {', '.join(sizes)} ({n_classes} classes, {measure})"
    )
