"""Epoch order: which index positions an epoch reads, in what order, and which shard of it
one input pipeline (replica or worker) reads."""

from __future__ import annotations

import numpy as np


def epoch_order(n: int, shuffle: bool, seed: int, epoch: int) -> np.ndarray:
    """The positions 0..n-1 in epoch `epoch`'s order: a fresh permutation per
    epoch from `(seed, epoch)` when shuffling, else the index order."""
    if not shuffle:
        return np.arange(n)
    return np.random.default_rng([seed, epoch]).permutation(n)


def shard_of(order: np.ndarray, batch_size: int, shard: int, num_shards: int) -> np.ndarray:
    """The part of an epoch's `order` that input pipeline `shard` of `num_shards` reads.

    The order is cut into batches of `batch_size`; pipeline `shard` takes
    batches shard, shard + num_shards, ... So, per epoch, every file goes to
    exactly one pipeline, all batches are full but the epoch's last one, and
    the pipelines' batch counts differ by at most one. Every worker computes
    the same order from the same seed, so the shards are disjoint.
    """
    if num_shards == 1:
        return order
    batch_of = np.arange(len(order)) // batch_size
    return order[batch_of % num_shards == shard]
