"""The trainer's side of tf.data service: a dispatcher address in, each epoch read from the workers.

`distributor(service)` returns the function `graph_dataset` applies to each
epoch's worker dataset: `tf.data.experimental.service.distribute` with
`processing_mode="distributed_epoch"` (ShardingPolicy.DYNAMIC): the dispatcher
hands out the epoch's positions to the workers, so each file is produced once
across them (at most once when a worker restarts mid-epoch: TF's
`ShardingPolicy` documentation). Each `iter()` registers that epoch's graph
(its order is a constant in it) and reads it as a new anonymous job.
Batching: the workers send transfer batches (several per worker end partial)
and the trainer rebatches to Keras's batches (`graph_dataset`).
https://www.tensorflow.org/api_docs/python/tf/data/experimental/service/distribute
"""

from __future__ import annotations

import socket

from dali_loader.plan import parse_service  # noqa: F401 - the option's one check

COMPRESSIONS = ("AUTO", None)


def check_reachable(host: str, port: int, timeout: float = 10.0) -> None:
    """A TCP connection to the dispatcher within `timeout` seconds, or a clear error
    (TF's own client would retry for minutes).

    Raises:
        ConnectionError: naming the address and what to do.
    """
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as e:
        raise ConnectionError(
            f"Cannot reach the tf.data service dispatcher at {host}:{port} within {timeout:g} s "
            f"({e}). Start it with `dali-loader serve dispatcher --port {port}` and its workers "
            f"with `dali-loader serve worker --dispatcher {host}:{port}`, or check the firewall."
        ) from None


def distributor(service: str, *, compression: str | None = "AUTO", tf=None):
    """`dataset -> dataset`: reads `dataset` from the service at `service`,
    each element once across workers (`distributed_epoch`).

    Args:
        compression: "AUTO" (snappy on the workers, when it pays) or None
            (docs/service.md measures both).
    """
    if compression not in COMPRESSIONS:
        raise ValueError(f'`compression` must be "AUTO" or None. Received: compression={compression!r}')
    if tf is None:
        from dali_loader.lazy import import_tf

        tf = import_tf()
    distribute = tf.data.experimental.service.distribute(
        processing_mode=tf.data.experimental.service.ShardingPolicy.DYNAMIC,
        service=service, compression=compression)

    def apply(dataset):
        return dataset.apply(distribute)

    return apply


def service_dataset(index, spec, batch_size, label_mode, num_classes, plan,
                    compression: str | None = "AUTO"):
    """`graph_dataset` read from the tf.data service the plan names (checked reachable
    first), with its seed, shuffle, `on_error` and reads in flight (`decode_calls`)."""
    from dali_loader.tfdata.graph_dataset import graph_dataset

    o = plan.options
    check_reachable(*plan.service_address)
    return graph_dataset(index, spec, batch_size, label_mode, num_classes, seed=o.seed,
                         shuffle=o.shuffle, on_error=o.on_error, parallel=plan.decode_calls,
                         distribute=distributor(o.service, compression=compression))
