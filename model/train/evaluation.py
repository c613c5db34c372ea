"""Validation: the task's figures (:mod:`.tasks`) over a whole loader, summed over ranks."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from ..normalize import check_uint8_input
from .mix import SplitVals
from .runtime import AmpSpec, Dist
from .tasks import Task


@torch.no_grad()
def evaluate(
    model: nn.Module, loader: Iterable, *, device: torch.device, amp: AmpSpec, task: Task, dist: Dist | None = None
) -> dict[str, Any]:
    """The task's validation figures over the whole loader (:meth:`.tasks.Task.metrics`).

    Figures stay on the device (no per-batch sync) and are summed across ranks, so each
    sample counts exactly once when the loader splits val samples without padding.
    ``model`` must not be the DDP wrapper (ranks may see different batch counts).

    A mix's :class:`~.mix.SplitVals` is read split by split: the figures are over all of them, and
    ``splits`` holds each split's own (by its name).

    Returns:
        ``n`` (samples), ``loss`` (mean per sample; none for detect) and the task's figures:
        ``top1``/``top5`` (classify), ``mse``/``mae``/``r2`` (regress), ``miou``/``pixel_acc``
        (segment), ``map`` (multilabel), ``map``/``map50`` (detect).
    """
    was_training = model.training
    model.eval()
    metrics = task.metrics(device)
    if isinstance(loader, SplitVals):  # a mix: each split's figures too, and overall
        per_split = {name: task.metrics(device) for name, _ in loader.loaders}
        for name, split_loader in loader.loaders:
            _accumulate(model, split_loader, (metrics, per_split[name]), device=device, amp=amp)
    else:
        _accumulate(model, loader, (metrics,), device=device, amp=amp)
    model.train(was_training)
    figures = metrics.compute(dist or Dist())  # the one sync of the evaluation (one per split more in a mix)
    if isinstance(loader, SplitVals):
        figures["splits"] = {name: m.compute(dist or Dist()) for name, m in per_split.items()}
    return figures


def _accumulate(model: nn.Module, loader: Iterable, metrics: tuple, *, device: torch.device, amp: AmpSpec) -> None:
    for images, targets in loader:
        targets = targets.to(device, non_blocking=True)
        with amp.autocast():
            try:
                out = model(images).float()
            except (RuntimeError, NotImplementedError) as e:  # a network without Normalize: one line
                check_uint8_input(e, images)
                raise
        for m in metrics:
            m.update(out, targets)
