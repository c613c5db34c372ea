"""Validation: top-1/top-5 (or the case study's regression figures) over a whole loader."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..case_study import regress_stats
from .runtime import AmpSpec, Dist, all_reduce_sum


@torch.no_grad()
def evaluate(
    model: nn.Module, loader: Iterable, *, device: torch.device, amp: AmpSpec, task: str, dist: Dist | None = None
) -> dict[str, Any]:
    """Top-1/top-5 (classify) or MSE + rounded accuracy (regress) over the whole loader.

    Counts stay on the device (no per-batch sync) and are summed across ranks, so each
    sample counts exactly once when the loader splits val samples without padding.
    ``model`` must not be the DDP wrapper (ranks may see different batch counts).

    Returns:
        ``n`` (samples), ``top1``, ``top5`` (None for regress), ``loss`` (mean per sample).
    """
    was_training = model.training
    model.eval()
    stats = torch.zeros(4, dtype=torch.float64, device=device)  # top1, top5, count, loss sum
    for images, labels in loader:
        labels = labels.to(device, non_blocking=True)
        with amp.autocast():
            out = model(images)
        out = out.float()
        if task == "classify":
            top = out.topk(min(5, out.shape[1]), dim=1).indices
            hit = top == labels[:, None]
            stats[0] += hit[:, 0].sum()
            stats[1] += hit.any(dim=1).sum()
            stats[3] += F.cross_entropy(out, labels, reduction="sum")
        else:
            hits, squared = regress_stats(out, labels)
            stats[0] += hits
            stats[3] += squared
        stats[2] += labels.numel()
    all_reduce_sum(stats, dist or Dist())
    top1, top5, n, loss = stats.tolist()  # the one sync of the evaluation
    model.train(was_training)
    n = int(n)
    res = {"n": n, "top1": top1 / n if n else float("nan"), "loss": loss / n if n else float("nan")}
    res["top5"] = top5 / n if n and task == "classify" else None
    return res
