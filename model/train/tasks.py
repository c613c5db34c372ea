"""What a run learns: the task of a split's targets, its loss, and its validation figures.

==============  ===============================  =======================  ===================================
task            split's targets                  loss                     validation (``best.pt`` by)
==============  ===============================  =======================  ===================================
``classify``    classes                          cross-entropy            top-1 (by), top-5
``regress``     float ``[N]`` / ``[N, K]``       MSE over the K outputs   MSE, MAE, R² (by)
``regress``     classes (the case study)         MSE on the label value   rounded accuracy (by), MSE
``segment``     masks                            cross-entropy, ignore    mIoU (by), pixel accuracy
``multilabel``  multi-hot                        BCE with logits          mAP (by)
``detect``      boxes                            the detector's losses    COCO mAP (by), mAP@50
==============  ===============================  =======================  ===================================

``auto`` (``stoker train``'s default) picks the task of the split's targets. Each metric sums on
the device (no host sync per batch) and across ranks, so a sample counts exactly once; mAP is
exact: the scores of every val sample are gathered (``C`` floats a sample).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from stoker.errors import ArgumentError

from ..case_study import regress_loss, regress_stats
from .config import TASKS
from .runtime import Dist, all_reduce_sum


@dataclass(frozen=True)
class Task:
    """A resolved task: its ``name``, the network's ``num_outputs``, the ``metric`` that picks
    ``best.pt`` (higher is better), and for masks the ``ignore_index``. ``case_study``: regression
    onto a class split's label value (the report this project was seeded from)."""

    name: str
    num_outputs: int
    metric: str
    ignore_index: int | None = None
    case_study: bool = False
    #: regress on standardized targets: each column's std; the loss is the MSE in those units (so
    #: ~1 - R² whatever the targets' own units), the validation figures stay in the targets' units
    scale: tuple[float, ...] | None = None

    def loss(self, *, label_smoothing: float = 0.0) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        """``loss(outputs, targets)``, computed under autocast (the reduction in float32)."""
        if self.name == "classify":
            return lambda out, y: F.cross_entropy(out, y, label_smoothing=label_smoothing)
        if self.name == "detect":  # the detector's own losses, computed in its forward
            from ..detection import detection_loss

            return detection_loss
        if self.case_study:
            return regress_loss
        if self.name == "regress":
            return _regress_loss(self.scale)
        if self.name == "segment":
            ignore = -100 if self.ignore_index is None else self.ignore_index
            return lambda out, y: F.cross_entropy(out.float(), y.long(), ignore_index=ignore)
        return lambda out, y: F.binary_cross_entropy_with_logits(out.float(), y.float())

    def metrics(self, device: torch.device) -> Metrics:
        """A fresh accumulator of this task's validation figures."""
        cls = {"classify": ClassifyMetrics, "segment": SegmentMetrics, "multilabel": MultilabelMetrics}.get(self.name)
        if self.name == "detect":
            cls = DetectMetrics
        if self.case_study:
            return CaseStudyMetrics(self, device)
        return (cls or RegressMetrics)(self, device)

    def synthetic(self, n: int, hw: tuple[int, int], generator: torch.Generator) -> torch.Tensor:
        """A batch of ``n`` random targets of this task (``hw``: a mask's size): what a step timed
        without data (``stoker diagnose``) trains on."""
        k = self.num_outputs
        make = {
            "classify": lambda: torch.randint(0, k, (n,), generator=generator),
            "regress": lambda: torch.rand((n, k) if k > 1 else (n,), generator=generator),
            "multilabel": lambda: (torch.rand((n, k), generator=generator) < 0.3).float(),
        }.get(self.name)
        if make is not None:
            return make()
        if self.name == "detect":
            from ..detection import synthetic_boxes

            return synthetic_boxes(n, hw, k, generator)
        return torch.randint(0, k, (n, *hw), generator=generator).to(torch.uint8)  # segment: masks


def _regress_loss(scale: tuple[float, ...] | None) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """MSE over the K outputs, in units of ``scale`` (each column's std) when given."""
    per_device: dict = {}  # the scale on each device, made once (not a host->device copy per step)

    def loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = out.float().view(out.shape[0], -1)
        y = y.float().view(out.shape[0], -1)
        if scale is None:
            return F.mse_loss(out, y)
        s = per_device.get(out.device)
        if s is None:
            s = per_device[out.device] = torch.tensor(scale, dtype=torch.float32, device=out.device)
        return F.mse_loss(out / s, y / s)

    return loss


def resolve_task(requested: str, target, classes: list, *, num_classes: int | None = None) -> Task:
    """The task ``requested`` (one of :data:`TASKS`) on a split whose manifest says ``target``
    (:class:`~stoker.pipeline.shards.targets.Target`) and ``classes``.

    Raises:
        ValueError: a task the split's targets cannot train, in one line naming both and the fix.
    """
    # the split's target kind names the task it trains and the outputs (stoker.pipeline.shards.kinds)
    name = target.task if requested == "auto" else requested
    if name not in TASKS[1:]:
        raise ArgumentError(f"task={requested!r} is not one of {', '.join(TASKS)}")
    if name == "regress" and target.task == "classify":  # the case study: one output onto the label value
        return Task("regress", 1, "top1", case_study=True)
    if target.task != name:
        raise ArgumentError(
            f"--task {name} needs {_kind_of(name)} targets, but the split's are {target.describe()} "
            f"(use --task {target.task} or --task auto)"
        )
    outputs = target.outputs(classes, num_classes)
    if name == "classify" and outputs < 2:
        raise ArgumentError(f"{outputs} class(es); classification needs at least 2")
    return Task(name, outputs, _METRIC[name], ignore_index=target.ignore_index if target.spatial else None)


#: the figure each task's ``best.pt`` is picked by (higher is better)
_METRIC = {"classify": "top1", "regress": "r2", "multilabel": "map", "segment": "miou", "detect": "map"}


def _kind_of(task: str) -> str:
    from stoker.pipeline.shards.kinds import kinds

    return " or ".join(k.name for k in kinds() if k.task == task)


# ---- validation figures -------------------------------------------------------------------------
class Metrics:
    """Sums a task's figures over batches on the device; :meth:`compute` sums them over ranks
    (the one host sync of an evaluation) and returns ``{"n", "loss", <figures>}``."""

    def __init__(self, task: Task, device: torch.device):
        self.task, self.device = task, device
        self.loss_fn = task.loss()

    def update(self, out: torch.Tensor, targets: torch.Tensor) -> None:
        raise NotImplementedError

    def compute(self, dist: Dist) -> dict:
        raise NotImplementedError


class ClassifyMetrics(Metrics):
    def __init__(self, task: Task, device: torch.device):
        super().__init__(task, device)
        k = task.num_outputs
        # top1, top5, n, loss sum; then per class: samples, top-1 hits (the balanced accuracy)
        self.stats = torch.zeros(4 + 2 * k, dtype=torch.float64, device=device)

    def update(self, out, y):
        top = out.topk(min(5, out.shape[1]), dim=1).indices
        hit = top == y[:, None]
        self.stats[0] += hit[:, 0].sum()
        self.stats[1] += hit.any(dim=1).sum()
        self.stats[2] += y.numel()
        self.stats[3] += F.cross_entropy(out, y, reduction="sum")
        k = self.task.num_outputs
        self.stats[4:] += torch.cat(
            [torch.bincount(y, minlength=k).double(), torch.bincount(y, hit[:, 0].double(), minlength=k)]
        )

    def compute(self, dist):
        stats = all_reduce_sum(self.stats, dist)
        top1, top5, n, loss = stats[:4].tolist()
        seen, hits = stats[4:].view(2, -1)
        # the mean of the per-class top-1 over the classes val holds: a long tail's rare classes count
        balanced = (hits[seen > 0] / seen[seen > 0]).mean().item() if bool((seen > 0).any()) else None
        return {
            "n": int(n),
            "top1": _div(top1, n),
            "top5": _div(top5, n),
            "loss": _div(loss, n),
            "balanced_top1": balanced,
        }


class CaseStudyMetrics(Metrics):
    def __init__(self, task: Task, device: torch.device):
        super().__init__(task, device)
        self.stats = torch.zeros(3, dtype=torch.float64, device=device)  # rounded hits, n, squared error

    def update(self, out, y):
        hits, squared = regress_stats(out, y)
        self.stats[0] += hits
        self.stats[1] += y.numel()
        self.stats[2] += squared

    def compute(self, dist):
        hits, n, squared = all_reduce_sum(self.stats, dist).tolist()
        return {"n": int(n), "top1": _div(hits, n), "top5": None, "loss": _div(squared, n)}


class RegressMetrics(Metrics):
    def __init__(self, task: Task, device: torch.device):
        super().__init__(task, device)
        k = task.num_outputs
        # per column: squared error, absolute error, sum of y, sum of y^2; then n
        self.stats = torch.zeros(4 * k + 1, dtype=torch.float64, device=device)

    def update(self, out, y):
        pred = out.double().view(out.shape[0], -1)
        y = y.double().view(pred.shape[0], -1)
        err = pred - y
        self.stats[:-1] += torch.cat([(err**2).sum(0), err.abs().sum(0), y.sum(0), (y**2).sum(0)])
        self.stats[-1] += y.shape[0]

    def compute(self, dist):
        s = all_reduce_sum(self.stats, dist).cpu()
        k, n = self.task.num_outputs, float(s[-1])
        sq, ab, sy, sy2 = (s[i * k : (i + 1) * k] for i in range(4))
        if not n:
            return {"n": 0, "mse": float("nan"), "mae": float("nan"), "r2": float("nan"), "loss": float("nan")}
        total = sy2 - sy**2 / n  # sum of squares about the mean, per column
        r2 = torch.where(total > 0, 1 - sq / total.clamp(min=1e-12), torch.zeros_like(total))
        mse = float(sq.sum() / (n * k))
        # the loss as training measures it: in the standardized units when the run standardizes
        scale = torch.tensor(self.task.scale, dtype=torch.float64) if self.task.scale else torch.ones(k)
        loss = float((sq / scale**2).sum() / (n * k))
        return {"n": int(n), "mse": mse, "mae": float(ab.sum() / (n * k)), "r2": float(r2.mean()), "loss": loss}


class SegmentMetrics(Metrics):
    def __init__(self, task: Task, device: torch.device):
        super().__init__(task, device)
        c = task.num_outputs
        self.confusion = torch.zeros(c * c, dtype=torch.float64, device=device)
        self.stats = torch.zeros(2, dtype=torch.float64, device=device)  # images, loss sum

    def update(self, out, y):
        c = self.task.num_outputs
        y = y.long()
        keep = y != (self.task.ignore_index if self.task.ignore_index is not None else -1)
        keep &= y < c
        pred = out.argmax(1)
        self.confusion += torch.bincount(y[keep] * c + pred[keep], minlength=c * c).double()
        self.stats[0] += y.shape[0]
        self.stats[1] += self.loss_fn(out, y) * y.shape[0]

    def compute(self, dist):
        c = self.task.num_outputs
        conf = all_reduce_sum(self.confusion, dist).view(c, c).cpu()
        n, loss = all_reduce_sum(self.stats, dist).tolist()
        tp = conf.diag()
        union = conf.sum(0) + conf.sum(1) - tp
        present = union > 0
        miou = float((tp[present] / union[present]).mean()) if present.any() else float("nan")
        pixels = float(conf.sum())
        return {"n": int(n), "miou": miou, "pixel_acc": _div(float(tp.sum()), pixels), "loss": _div(loss, n)}


class MultilabelMetrics(Metrics):
    def __init__(self, task: Task, device: torch.device):
        super().__init__(task, device)
        self.scores: list = []
        self.targets: list = []
        self.stats = torch.zeros(2, dtype=torch.float64, device=device)  # n, loss sum

    def update(self, out, y):
        self.scores.append(out.float().detach())
        self.targets.append(y.float())
        self.stats[0] += y.shape[0]
        self.stats[1] += F.binary_cross_entropy_with_logits(out.float(), y.float(), reduction="sum") / out.shape[1]

    def compute(self, dist):
        n, loss = all_reduce_sum(self.stats, dist).tolist()
        c = self.task.num_outputs
        scores = torch.cat(self.scores).cpu() if self.scores else torch.zeros(0, c)
        targets = torch.cat(self.targets).cpu() if self.targets else torch.zeros(0, c)
        if dist.enabled:  # every rank's scores: mAP ranks all samples together
            import torch.distributed as tdist

            parts: list = [None] * dist.world_size
            tdist.all_gather_object(parts, (scores, targets))
            scores, targets = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
        return {"n": int(n), "map": average_precision(scores, targets), "loss": _div(loss, n)}


class DetectMetrics(Metrics):
    """COCO mAP (``map``, over IoU .5:.95) and ``map50`` of every val image, by torchmetrics'
    ``MeanAveragePrecision`` (crowd boxes scored as "ignore"); the images of every rank gathered."""

    def __init__(self, task: Task, device: torch.device, *, class_metrics: bool = False):
        self.task, self.device = task, device
        self.preds: list = []
        self.targets: list = []
        #: also each class's AP (``stoker eval``): :attr:`class_ap` after :meth:`compute`
        self.class_metrics = class_metrics
        self.class_ap: dict[int, float] = {}

    def update(self, out, y):
        y = y.to("cpu")
        for o, t in zip(out, y.to_list(), strict=True):
            self.preds.append({k: v.detach().float().cpu() if k != "labels" else v.cpu() for k, v in o.items()})
            self.targets.append(t)

    def compute(self, dist):
        preds, targets = self.preds, self.targets
        if dist.enabled:
            import torch.distributed as tdist

            parts: list = [None] * dist.world_size
            tdist.all_gather_object(parts, (preds, targets))
            preds, targets = [p for part in parts for p in part[0]], [t for part in parts for t in part[1]]
        try:
            from torchmetrics.detection import MeanAveragePrecision

            metric = MeanAveragePrecision(iou_type="bbox", class_metrics=self.class_metrics)
        except (ImportError, ModuleNotFoundError) as e:
            raise ArgumentError(
                f"--task detect scores COCO mAP with torchmetrics and pycocotools: pip install 'stoker[detect]' ({e})"
            ) from None
        if preds:
            metric.update(preds, targets)
            r = metric.compute()
            figure = lambda k: float(r[k]) if float(r[k]) >= 0 else float("nan")  # noqa: E731  (-1: no box at all)
            mean_ap, ap50 = figure("map"), figure("map_50")
            if self.class_metrics:  # -1: a class with no box in the split
                aps = r["map_per_class"].reshape(-1).tolist()
                classes = r["classes"].reshape(-1).tolist()
                self.class_ap = {int(c): a if a >= 0 else float("nan") for c, a in zip(classes, aps, strict=True)}
        else:
            mean_ap = ap50 = float("nan")
        return {"n": len(preds), "map": mean_ap, "map50": ap50}  # no loss: a detector in eval mode computes none


def average_precision(scores: torch.Tensor, targets: torch.Tensor) -> float:
    """The mean over classes with a positive of each class's average precision (the area under
    its precision-recall steps, as scikit-learn's ``average_precision_score``)."""
    aps = []
    for k in range(scores.shape[1]):
        pos = targets[:, k] > 0.5
        if not pos.any():
            continue
        order = torch.argsort(scores[:, k], descending=True, stable=True)
        hits = pos[order].double()
        s = scores[order, k]
        # precision at each distinct threshold, counted at the last sample of a tie
        last = torch.ones_like(s, dtype=torch.bool)
        last[:-1] = s[:-1] != s[1:]
        tp = hits.cumsum(0)[last]
        seen = torch.arange(1, len(s) + 1, dtype=torch.float64)[last]
        recall_step = torch.diff(tp, prepend=torch.zeros(1, dtype=torch.float64)) / pos.sum()
        aps.append(float((recall_step * tp / seen).sum()))
    return sum(aps) / len(aps) if aps else float("nan")


def _div(a, b) -> float:
    return a / b if b else float("nan")


__all__ = ["TASKS", "DetectMetrics", "Metrics", "Task", "average_precision", "resolve_task"]
