"""Epoch order: which index positions an epoch reads, in what order."""

from __future__ import annotations

import numpy as np


def epoch_order(n: int, shuffle: bool, seed: int, epoch: int) -> np.ndarray:
    """The positions 0..n-1 in epoch `epoch`'s order: a fresh permutation per
    epoch from `(seed, epoch)` when shuffling, else the index order."""
    if not shuffle:
        return np.arange(n)
    return np.random.default_rng([seed, epoch]).permutation(n)
