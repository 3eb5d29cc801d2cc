r"""The search kernels' filter bitmaps: one bit per item, each shard's bits starting at a word
of their own (see :mod:`service.model.kernels.search`).
"""

import numba
import numpy as np

# One bit, as the bitmaps' words are typed.
ONE = np.uint64(1)


@numba.njit(cache=True, nogil=True)
def popcount(word):
    r"""The number of set bits of a 64-bit word (SWAR).

    .. math:: \operatorname{popcount}(x) = \sum_{b=0}^{63} \lfloor x / 2^b \rfloor \bmod 2

    Parameters
    ----------
    word : uint64

    Returns
    -------
    uint64
    """
    x = word - ((word >> ONE) & np.uint64(0x5555555555555555))
    x = (x & np.uint64(0x3333333333333333)) + ((x >> np.uint64(2)) & np.uint64(0x3333333333333333))
    x = (x + (x >> np.uint64(4))) & np.uint64(0x0F0F0F0F0F0F0F0F)
    return (x * np.uint64(0x0101010101010101)) >> np.uint64(56)


@numba.njit(cache=True, nogil=True)
def bit_is_set(allowed, base, j):
    r"""Whether bit ``j`` of the bitmap starting at word ``base`` is set.

    .. math:: \lfloor a_{\text{base} + \lfloor j / 64 \rfloor} / 2^{j \bmod 64} \rfloor \bmod 2 = 1

    Parameters
    ----------
    allowed : ndarray of uint64
    base : int
    j : int

    Returns
    -------
    bool
    """
    return (allowed[base + (j >> 6)] >> np.uint64(j & 63)) & ONE != 0


@numba.njit(cache=True, nogil=True)
def count_allowed(allowed, base, lo, hi):
    r"""The set bits ``lo <= j < hi`` of the bitmap starting at word ``base``.

    .. math:: \sum_{j = lo}^{hi - 1} \operatorname{bit}_j

    Parameters
    ----------
    allowed : ndarray of uint64
    base, lo, hi : int

    Returns
    -------
    int
    """
    count = 0
    for w in range(lo >> 6, (hi + 63) >> 6):
        word = allowed[base + w]
        if w == lo >> 6:
            word &= ~((ONE << np.uint64(lo & 63)) - ONE)  # the bits before lo
        if w == (hi - 1) >> 6 and hi & 63:
            word &= (ONE << np.uint64(hi & 63)) - ONE  # the bits from hi on
        count += np.int64(popcount(word))
    return count
