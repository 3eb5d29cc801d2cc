r"""The search kernels' bounded top-k: a min-heap of the best items so far whose root is the
worst of them, ranked by score and then by lower global position (see
:mod:`service.model.kernels.search`).
"""

import numba


@numba.njit(cache=True, nogil=True)
def is_worse(score_a, position_a, score_b, position_b):
    r"""Whether item a ranks after item b: lower score, or equal score and higher position.

    .. math:: a \prec b \iff s_a < s_b \lor (s_a = s_b \land j_a > j_b)

    Parameters
    ----------
    score_a, score_b : float
    position_a, position_b : int

    Returns
    -------
    bool
    """
    return score_a < score_b or (score_a == score_b and position_a > position_b)


@numba.njit(cache=True, nogil=True)
def sift_down(heap_scores, heap_positions, size, i):
    r"""Restore the heap below node ``i``: every parent ranks no better than its children.

    .. math:: \forall c \in \{2i + 1, 2i + 2\},\ c < \text{size}:
              \neg\, (c \prec \text{parent}(c))

    Parameters
    ----------
    heap_scores : ndarray of shape (>= size,), float64
    heap_positions : ndarray of shape (>= size,), int64
    size : int
    i : int
        The node whose entry may rank better than a child's.
    """
    score = heap_scores[i]
    position = heap_positions[i]
    while True:
        child = 2 * i + 1
        if child >= size:
            break
        right = child + 1
        if right < size and is_worse(
            heap_scores[right], heap_positions[right], heap_scores[child], heap_positions[child]
        ):
            child = right
        if not is_worse(heap_scores[child], heap_positions[child], score, position):
            break
        heap_scores[i] = heap_scores[child]
        heap_positions[i] = heap_positions[child]
        i = child
    heap_scores[i] = score
    heap_positions[i] = position


@numba.njit(cache=True, nogil=True)
def heap_offer(heap_scores, heap_positions, size, capacity, score, position):
    r"""Offer one item to a bounded heap of the best ``capacity`` items; return the new size.

    The root holds the worst kept item. Below capacity the item is inserted (sifted up);
    at capacity it replaces the root only if it ranks better:

    .. math:: H \leftarrow \operatorname{top}_{\text{capacity}}(H \cup \{(s, j)\})

    Parameters
    ----------
    heap_scores : ndarray of shape (capacity,), float64
    heap_positions : ndarray of shape (capacity,), int64
    size, capacity : int
    score : float
    position : int

    Returns
    -------
    int
    """
    if size < capacity:
        i = size
        while i > 0:
            parent = (i - 1) // 2
            if not is_worse(score, position, heap_scores[parent], heap_positions[parent]):
                break
            heap_scores[i] = heap_scores[parent]
            heap_positions[i] = heap_positions[parent]
            i = parent
        heap_scores[i] = score
        heap_positions[i] = position
        return size + 1
    if capacity > 0 and is_worse(heap_scores[0], heap_positions[0], score, position):
        heap_scores[0] = score
        heap_positions[0] = position
        sift_down(heap_scores, heap_positions, size, 0)
    return size


@numba.njit(cache=True, nogil=True)
def offer_after(heap_scores, heap_positions, size, capacity, score, position, after_sum, after_pos):
    r"""Offer an item to the heap only if it ranks after the cursor item; return the new size.

    .. math:: H \leftarrow \operatorname{top}(H \cup \{(s, j)\}) \ \text{if}\ (s, j) \prec
              (s_\text{after}, j_\text{after})

    Parameters
    ----------
    heap_scores, heap_positions : ndarray of shape (capacity,)
    size, capacity : int
    score : float
    position : int
    after_sum : float
        ``inf`` without a cursor.
    after_pos : int

    Returns
    -------
    int
    """
    if not is_worse(score, position, after_sum, after_pos):
        return size
    return heap_offer(heap_scores, heap_positions, size, capacity, score, position)


@numba.njit(cache=True, nogil=True)
def sort_heap(heap_scores, heap_positions, size):
    r"""Sort a heap of :func:`heap_offer` in place, best first (heapsort).

    .. math:: (s_0, j_0) \succ (s_1, j_1) \succ \dots \succ (s_{\text{size}-1}, j_{\text{size}-1})

    Parameters
    ----------
    heap_scores, heap_positions : ndarray of shape (>= size,)
    size : int
    """
    for last in range(size - 1, 0, -1):
        score = heap_scores[0]
        position = heap_positions[0]
        heap_scores[0] = heap_scores[last]
        heap_positions[0] = heap_positions[last]
        heap_scores[last] = score
        heap_positions[last] = position
        sift_down(heap_scores, heap_positions, last, 0)
