"""input_context=: each input pipeline reads its own batches of every epoch, in process."""

from __future__ import annotations

import pytest

tf = pytest.importorskip("tensorflow")

from tf_adapter import image_dataset_from_directory as ours  # noqa: E402


def ids(batch) -> list[int]:
    return [int(round(float(v) / 10)) for v in batch.numpy()[:, 0, 0, 0]]


@pytest.mark.parametrize("decoder", ["tf", "dali"])
@pytest.mark.parametrize("pipelines", [2, 3])
def test_pipelines_split_each_epoch_exactly_once(id_tree, decoder, pipelines):
    contexts = [tf.distribute.InputContext(num_input_pipelines=pipelines, input_pipeline_id=p,
                                           num_replicas_in_sync=pipelines)
                for p in range(pipelines)]
    per_replica = contexts[0].get_per_replica_batch_size(3 * pipelines)
    splits = [ours(str(id_tree), image_size=(8, 8), batch_size=per_replica, seed=4,
                   validation_split=0.25, subset="both", decoder=decoder, input_context=ctx,
                   verbose=False) for ctx in contexts]
    train = [s[0] for s in splits]
    val = [s[1] for s in splits]
    train_ids = {i for x, _ in ours(str(id_tree), image_size=(8, 8), seed=4, verbose=False,
                                    validation_split=0.25, subset="training") for i in ids(x)}
    for epoch in range(2):
        seen = [[i for x, _ in ds for i in ids(x)] for ds in train]
        assert sorted(i for s in seen for i in s) == sorted(train_ids)  # once, and only train
        batches = [len(list(ds)) for ds in train]
        assert max(batches) - min(batches) <= 1
        assert [int(ds.cardinality()) for ds in train] == batches  # known to Keras
        val_seen = sorted(i for ds in val for x, _ in ds for i in ids(x))
        assert val_seen == sorted(set(range(23)) - train_ids)  # no overlap with training


def test_uneven_shards_leave_the_cardinality_unknown(id_tree):
    """5 batches over 2 pipelines (3 and 2): declared, the workers would run different
    step counts; unknown, tf.distribute runs both until all are exhausted."""
    kw = dict(image_size=(8, 8), batch_size=5, seed=1, verbose=False, label_mode=None)
    shards = [ours(str(id_tree), input_context=tf.distribute.InputContext(2, p, 2), **kw)
              for p in range(2)]
    assert [len(list(ds)) for ds in shards] == [3, 2]
    assert [int(ds.cardinality()) for ds in shards] == [tf.data.UNKNOWN_CARDINALITY] * 2
    even = [ours(str(id_tree), input_context=tf.distribute.InputContext(2, p, 2),
                 **{**kw, "batch_size": 6}) for p in range(2)]  # 4 batches: 2 + 2
    assert [int(ds.cardinality()) for ds in even] == [2, 2]


def test_input_context_is_checked(id_tree):
    with pytest.raises(ValueError, match="input_context"):
        ours(str(id_tree), input_context=object())
    ctx = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=0)
    with pytest.raises(ValueError, match="same `seed`"):  # else the shards would overlap
        ours(str(id_tree), input_context=ctx)
    ours(str(id_tree), input_context=ctx, shuffle=False, verbose=False)  # no seed needed
