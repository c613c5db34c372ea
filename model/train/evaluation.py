"""Validation: the task's figures (:mod:`.tasks`) over a whole loader, summed over ranks."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

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

    Returns:
        ``n`` (samples), ``loss`` (mean per sample) and the task's figures: ``top1``/``top5``
        (classify), ``mse``/``mae``/``r2`` (regress), ``miou``/``pixel_acc`` (segment), ``map``
        (multilabel).
    """
    was_training = model.training
    model.eval()
    metrics = task.metrics(device)
    for images, targets in loader:
        targets = targets.to(device, non_blocking=True)
        with amp.autocast():
            out = model(images)
        metrics.update(out.float(), targets)
    model.train(was_training)
    return metrics.compute(dist or Dist())  # the one sync of the evaluation
