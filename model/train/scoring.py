"""A checkpoint's validation figures on any split (``stoker eval CKPT SPLIT``), per class where the
split's targets have classes.

The network is built as its run built it (:meth:`~stoker.model.inference.Predictor.from_checkpoint`),
the split is read with the run's val transform (its val crop, ``crop_pct``/``val_resize``), and the
figures are the task's own (:mod:`.tasks`), so ``stoker eval RUN/last.pt DATA/val`` gives the
figures the run's last epoch reported. Per class: top-1 and the sample count (classify), IoU and
the pixel count (segment), average precision and the positives (multilabel; detect: COCO AP over
IoU .5:.95 and the boxes not marked crowd). A detection run can also write a COCO results file in
the dataset's own image and category ids (:mod:`.coco_results`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from stoker.errors import ArgumentError, UsageError, arg

from .runtime import Dist, resolve_amp, resolve_device
from .tasks import (
    ClassifyMetrics,
    DetectMetrics,
    MultilabelMetrics,
    SegmentMetrics,
    Task,
    average_precision,
    resolve_task,
)


def run_checkpoint(path: str | Path) -> tuple[Path, str]:
    """The checkpoint ``stoker eval`` reads for ``path``: a file as it is; a run folder's ``best.pt``,
    else its ``last.pt`` (a run without val, or before its first val pass, has none). Returns the
    checkpoint and the line saying which one a run folder gave (``""`` for a file).

    Raises:
        UsageError: ``path`` does not exist, or is a folder that holds neither checkpoint.
    """
    from .config import BEST, LAST

    path = Path(path)
    if not path.is_dir():
        if not path.is_file():
            raise UsageError(f"{path} does not exist")
        return path, ""
    if (path / BEST).is_file():
        return path / BEST, f"{path} is a run: evaluating its {BEST} (the best val figure of the run)"
    if (path / LAST).is_file():
        why = "no val figure yet, or no val split"
        return path / LAST, f"{path} is a run without a {BEST} ({why}): evaluating its {LAST}"
    raise UsageError(
        f"{path} holds no checkpoint ({BEST}, {LAST}): give a run folder of `stoker train` or a checkpoint"
    )


def check_paths(checkpoint: str | Path, split: str) -> None:
    """One line (exit 2) for a checkpoint that is not a file or a path that is not a split, worded
    as every command words it (:func:`stoker.pipeline.shards.paths.check_path`); a pack's root
    given for the split names its ``val/`` (what an evaluation reads) before its ``train/``."""
    from stoker.errors import NotPackedError
    from stoker.pipeline.shards.paths import MANIFEST_NAME, check_path

    ckpt = Path(checkpoint)
    if ckpt.is_dir():
        raise UsageError(f"{ckpt} is a run folder, not a checkpoint: give {ckpt / 'best.pt'} or {ckpt / 'last.pt'}")
    if not ckpt.is_file():
        raise UsageError(f"{ckpt} does not exist")
    root = Path(split)
    if not (root / MANIFEST_NAME).is_file() and (root / "val" / MANIFEST_NAME).is_file():
        train = f" ({root / 'train'} for the train figures)" if (root / "train" / MANIFEST_NAME).is_file() else ""
        raise NotPackedError(f"no {MANIFEST_NAME} in {root}: give a split, did you mean {root / 'val'}?{train}")
    check_path(split, "split")  # the same line as every command's for a wrong split


def _task_of(config: dict, manifest: Any, split: str) -> Task:
    """The checkpoint's task on ``split``: the split must hold its kind of targets and classes."""
    try:
        task = resolve_task(config.get("task", "classify"), manifest.target, list(manifest.classes))
    except ValueError as e:
        raise ArgumentError(f"{split}: {e}") from None
    theirs, ours = config.get("classes"), list(manifest.classes)
    if theirs and ours and theirs != ours:
        first = next((f"{a!r} vs {b!r}" for a, b in zip(theirs, ours, strict=False) if a != b), "their number")
        raise ArgumentError(
            f"{split}: its classes are not the checkpoint's ({len(ours)} vs {len(theirs)}, first difference: "
            f"{first}): evaluate on a split packed with the same classes"
        )
    if task.num_outputs != config.get("num_outputs", task.num_outputs):
        raise ArgumentError(
            f"{split}: the split's targets need {task.num_outputs} outputs, the checkpoint's network has "
            f"{config['num_outputs']}"
        )
    units = config.get("target_units")
    return dataclasses.replace(task, scale=tuple(units["std"])) if units else task


def per_class(task: Task, metrics: Any, classes: list[str], seen: torch.Tensor, hits: torch.Tensor) -> list[dict]:
    """The per-class rows of an evaluation (none for a regression)."""
    names = classes or [str(k) for k in range(task.num_outputs)]
    if isinstance(metrics, ClassifyMetrics):
        return [
            {"class": names[k], "n": int(n), "top1": float(h / n) if n else None}
            for k, (n, h) in enumerate(zip(seen.tolist(), hits.tolist(), strict=True))
        ]
    if isinstance(metrics, SegmentMetrics):
        c = task.num_outputs
        conf = metrics.confusion.view(c, c).cpu()
        tp, union = conf.diag(), conf.sum(0) + conf.sum(1) - conf.diag()
        return [
            {"class": names[k], "pixels": int(conf[k].sum()), "iou": float(tp[k] / union[k]) if union[k] else None}
            for k in range(c)
        ]
    if isinstance(metrics, DetectMetrics):
        positives = torch.zeros(task.num_outputs, dtype=torch.int64)
        for t in metrics.targets:  # the boxes scored: crowd ones are "ignore"
            labels = t["labels"][~t["iscrowd"].bool()] if "iscrowd" in t else t["labels"]
            positives += torch.bincount(labels.cpu(), minlength=task.num_outputs)[: task.num_outputs]
        return [
            {"class": names[k], "positives": int(positives[k]), "ap": metrics.class_ap.get(k) if positives[k] else None}
            for k in range(task.num_outputs)
        ]
    if isinstance(metrics, MultilabelMetrics) and metrics.scores:
        scores, targets = torch.cat(metrics.scores).cpu(), torch.cat(metrics.targets).cpu()
        rows = []
        for k in range(task.num_outputs):
            ap = average_precision(scores[:, k : k + 1], targets[:, k : k + 1])
            rows.append({"class": names[k], "positives": int((targets[:, k] > 0.5).sum()), "ap": ap})
        return rows
    return []


def _val_crops(config: dict) -> Any:
    """The run's val crop (:class:`~stoker.pipeline.augment.CropSpec`), as its config says."""
    from stoker.pipeline.augment import CropSpec

    crop = config.get("val_crop") or config.get("crop", 224)
    return CropSpec.of(
        tuple(crop) if isinstance(crop, list) else crop,
        crop_pct=config.get("crop_pct"),
        val_resize=config.get("val_resize"),
        val_fit=config.get("val_fit", "auto"),
    )


def _val_loader(config: dict, split: str, *, batch_size: int, device: torch.device, options: dict) -> Any:
    """The split read as the run's val split: its val crop and resize, its channels, every sample once."""
    from stoker.pipeline import Loader

    crops = _val_crops(config)
    channels = int(config.get("channels") or 3)
    return Loader(
        split,
        batch_size=batch_size,
        train=False,
        drop_last=False,
        crop=crops,
        channels=channels,
        device=str(device),
        **({"buckets": [tuple(hw) for hw in config["buckets"]]} if config.get("buckets") else {}),
        **options,
    )


@torch.no_grad()
def evaluate_checkpoint(
    checkpoint: str | Path,
    split: str,
    *,
    batch_size: int = 64,
    device: str = "auto",
    coco_results: str | Path | None = None,
    **loader_options: Any,
) -> dict[str, Any]:
    """The task's figures of ``checkpoint`` over the whole ``split``, and ``per_class`` rows.

    ``loader_options`` go to the :class:`~stoker.pipeline.Loader` (``backend=``, ``threads=``, ...).
    ``coco_results``: a detection run's detections are also written there as a COCO results file
    (the split's COCO image and category ids, boxes ``[x, y, w, h]`` in the original pixels;
    ``coco_results`` and its detection count are then in the result).

    Returns:
        ``checkpoint``, ``split``, ``arch``, ``task``, ``n``, ``loss`` and the task's
        figures (``top1``/``top5``, ``mse``/``mae``/``r2``, ``miou``/``pixel_acc``, ``map``), and
        ``per_class`` (a list; empty for a regression).

    Raises:
        UsageError: a path that is no checkpoint or no split (one line, exit 2 on the command line);
            ArgumentError: a split whose targets or classes are not the checkpoint's.
    """
    from stoker.pipeline.cache import read_manifest

    from ..inference import Predictor

    check_paths(checkpoint, split)
    if batch_size < 1:
        raise ArgumentError(f"batch_size={batch_size} must be >= 1")
    dev = resolve_device(device)
    predictor = Predictor.from_checkpoint(checkpoint, device=dev)
    config, model = predictor.config, predictor.model
    manifest = read_manifest(split, loader_options.get("storage_options"))
    task = _task_of(config, manifest, split)
    loader = _val_loader(config, split, batch_size=batch_size, device=dev, options=loader_options)
    amp = resolve_amp(config.get("amp_requested", "auto"), dev)
    metrics = task.metrics(dev)
    if isinstance(metrics, DetectMetrics):
        metrics.class_metrics = True  # the per-class rows
    elif coco_results is not None:
        raise ArgumentError(f"{arg('coco_results')} is for a detection run; {checkpoint} is a {task.name} run")
    seen = torch.zeros(task.num_outputs, dtype=torch.float64, device=dev)
    hits = torch.zeros_like(seen)
    for images, targets in loader:
        targets = targets.to(dev, non_blocking=True)
        with amp.autocast():
            out = model(images).float()
        metrics.update(out, targets)
        if isinstance(metrics, ClassifyMetrics):  # per-class counts stay on the device
            seen += torch.bincount(targets, minlength=task.num_outputs).double()
            hits += torch.bincount(targets[out.argmax(1) == targets], minlength=task.num_outputs).double()
    figures = metrics.compute(Dist())
    written = {}
    if coco_results is not None:
        from .coco_results import write_coco_results

        crops = _val_crops(config)  # as the loader read the split: its letterbox undone
        n = write_coco_results(coco_results, metrics.preds, split, crops.size, crops.letterbox("letterbox"))
        written = {"coco_results": str(coco_results), "detections": n}
    return {
        "checkpoint": str(checkpoint),
        "split": str(split),
        "arch": config.get("arch"),
        "task": task.name,
        **figures,
        "per_class": per_class(task, metrics, list(manifest.classes), seen, hits),
        **written,
    }


__all__ = ["check_paths", "evaluate_checkpoint", "per_class", "run_checkpoint"]
