"""`ds.loader`: the public handle on what a returned dataset iterates (TF-free).

Every dataset `image_dataset_from_directory` (or `api.open_dataset`) returns
carries one: the plan it was built from, what each epoch left out and counted,
seek/resume, and close. A dataset derived by a tf.data transformation
(`ds.map(...)`) does not carry it: keep the returned one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dali_loader.plan import Plan

if TYPE_CHECKING:
    from dali_loader.tfdata.audit import AuditRegistry


class LoaderHandle:
    """The public handle on a dataset's loader (`ds.loader`).

    Attributes:
        plan: The `dali_loader.plan.Plan` the dataset was built from: which
            engine, device, item reader, PNG decoder, cache form, handoff and
            checks run, and why (`print(ds.loader.plan.format())`).
        engine: What the dataset iterates: `DaliBatches` (the DALI engine) or
            a `Feed` (TF's kernels). Its own attributes are internal.
    """

    def __init__(self, engine: Any, plan: Plan, resume: Callable[[int, int], Any],
                 audits: AuditRegistry | None = None):
        self.engine = engine
        self.plan = plan
        self._resume = resume
        self._audits = audits

    @property
    def _feed(self):
        return getattr(self.engine, "feed", self.engine)

    @property
    def skipped(self) -> dict[str, str]:
        """Files left out under `on_error="skip"`, file -> reason (every epoch so far)."""
        return self.engine.skipped

    @property
    def epoch_stats(self) -> list[dict[str, int]]:
        """Per finished epoch, its counts: `files`, `cpu_decodes`, and by path
        `png_native`, `png_fast`, `png_fallbacks`, `cache_fills`..."""
        return self.engine.epoch_stats

    @property
    def epochs_started(self) -> int:
        """Iterations (epochs) started so far."""
        return self.engine.epochs_started

    @property
    def num_files(self) -> int:
        """Files each epoch reads (this input pipeline's share when sharded)."""
        return self.engine.num_files

    @property
    def num_batches(self) -> int:
        """Batches each epoch yields (this input pipeline's)."""
        return self._feed.num_batches

    @property
    def open_iterations(self) -> int | None:
        """TF's kernels over files: this dataset's iterations still feeding files (an
        abandoned iterator's closes with it); None on the other paths. One that fed out
        every file before its iterator was abandoned is `awaiting_checks` instead."""
        return None if self._audits is None else self._audits.feeding

    @property
    def awaiting_checks(self) -> int | None:
        """TF's kernels over files: iterations that fed out every file and whose last
        batches' checks have not come (kept for at most 64 abandoned ones); None elsewhere."""
        return None if self._audits is None else self._audits.awaiting

    @property
    def shard(self) -> tuple[int, int]:
        """`(pipeline, pipelines)` of `input_context`, else (0, 1)."""
        return self.plan.shard

    @property
    def device(self) -> str:
        """"gpu" or "cpu": where DALI decodes (TF's kernels run on the CPU)."""
        return self.plan.device.value

    def seek(self, epoch: int) -> None:
        """Numbers the next iteration `epoch` (its order; then epoch + 1, ...)."""
        self._feed.seek(epoch)

    def resume_at(self, epoch: int, step: int):
        """The dataset of epoch `epoch` from its batch `step` on (every iteration
        of it), over the same loader: the rest of an interrupted epoch."""
        return self._resume(epoch, step)

    def close(self) -> None:
        """Releases the pools, connections and cache pins now (else when collected)."""
        self.engine.close()

    def __enter__(self) -> LoaderHandle:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        p = self.plan
        return (f"LoaderHandle(engine={p.engine.value}, device={p.device.value}, "
                f"files={self.num_files}, png={p.describe_png()})")
