"""The main job on a built-in dataset: generate → pack → benchmark the loader → train.

Generates a small procedural classification dataset (six pattern classes, mixed sizes,
some grayscale, CMYK, PNG and broken files) into a cache directory, packs it with
``stoker pack``, measures stoker's Loader against the torchvision ImageFolder
baseline on the same images, trains the inception-block network for a few epochs, and
prints a summary. The dataset and shards are cached and reused; each run trains anew.
Uses the GPU when there is one; under 5 minutes on a 2-core CPU.

--task regress: pictures whose colour temperature is their float target (a CSV), trained
with MSE; the summary gives R² (well above 0: it learnt). --task segment: grayscale
pictures of textured shapes and their masks, a torchvision segmentation network on one
channel; the summary gives mIoU against predicting the background everywhere. --task detect:
pictures of shapes with their boxes (COCO JSON), packed and trained with a torchvision detector;
the summary gives mAP@50 and COCO mAP (guessing boxes scores about 0).

examples:
  stoker demo
  stoker demo --epochs 8 --per-class 400
  stoker demo --task regress
  stoker demo --task segment
  stoker demo --task detect
  stoker demo --tiny            # a seconds-long smoke run
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

from stoker.errors import CheckFailedError, UsageError, arg

from .common.results import Result

HELP = "the main job on a built-in dataset: generate, pack, benchmark the loader, train, summarize"
#: ``--task``
DEMO_TASKS = ("classify", "regress", "segment", "detect")


def default_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "stoker" / "demo"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--cache", type=Path, default=None, help=f"where data, shards and runs go (default: {default_cache()})"
    )
    p.add_argument("--per-class", type=int, default=200, help="training images per class (default: %(default)s)")
    p.add_argument(
        "--epochs",
        type=int,
        default=None,
        help="training epochs (default: classify 4, regress 12, segment 8, detect 12)",
    )
    p.add_argument("--batch-size", type=int, default=64, help="(default: %(default)s)")
    p.add_argument("--crop", type=int, default=None, help="crop side (default: 224 on a GPU, 64 on the CPU)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda (default: auto)")
    p.add_argument("--bench-seconds", type=float, default=8.0, help="time per loader measured (default: %(default)s)")
    p.add_argument("--tiny", action="store_true", help="tiny settings: a smoke run of a few seconds")
    p.add_argument(
        "--task",
        choices=DEMO_TASKS,
        default="classify",
        help="classify (default), regress (float targets), segment (grayscale images with masks), "
        "detect (pictures of shapes with their boxes, in COCO JSON)",
    )
    p.add_argument("--json", action="store_true", help="print the summary as JSON")


def _generate(images: Path, *, per_class: int, val_per_class: int) -> None:
    """Write SRC = images/{train,val}/<class>/ once; a crash leaves no half dataset."""
    from .common.synth import make_image_folder

    def make(tmp: Path) -> None:
        make_image_folder(tmp / "train", per_class=per_class, seed=0, nasty=True)
        make_image_folder(tmp / "val", per_class=val_per_class, seed=1)

    _make_once(images, images / "train", make)


def _make_once(root: Path, done: Path, make: Callable[[Path], None]) -> None:
    """Write ``root`` with ``make(tmp)`` unless ``done`` is there, through a ``.tmp`` sibling
    renamed at the end: a crash leaves no half dataset."""
    if done.exists():
        return
    tmp = root.with_name(root.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    make(tmp)
    os.replace(tmp, root)


@dataclasses.dataclass
class DemoResult(Result):
    """What :func:`demo` did; :meth:`to_dict` is ``stoker demo --json``.

    Attributes:
        images: The generated dataset (an ImageFolder with ``train/`` and ``val/``, a CSV, or an
            image folder beside its mask folder).
        shards: Where it was packed.
        run: The training run folder (checkpoints, metrics).
        packed: Images packed per split (``train``, ``val``).
        rejected: Inputs listed in ``rejects.jsonl``.
        loader: stoker's Loader against the usual PyTorch pipeline of the task (torchvision
            ImageFolder; a CSV Dataset; a (PIL image, PIL mask) Dataset): ``torchvision_images_per_s``,
            ``stoker_images_per_s``, ``stoker_backend``, ``speedup``.
        train: From the training summary: ``images_per_s``, ``data_wait``, ``val`` (the task's
            figures), ``val_top1``, ``val_top5``, ``val_samples``, ``train_loss``, ``steps``,
            ``seconds``, ``device``, ``amp``.
        chance_top1: Top-1 of guessing (1 / classes); classification only.
        seconds: The whole run.
        task: ``classify``, ``regress``, ``segment`` or ``detect``.
        chance: The task's figure when nothing is learnt: top-1 of guessing, R² 0 (predicting the
            mean), mIoU of calling every pixel background, mAP@50 of guessing boxes (0).
    """

    images: str
    shards: str
    run: str
    packed: dict
    rejected: int
    loader: dict
    train: dict
    chance_top1: float | None
    seconds: float
    task: str = "classify"
    chance: float = 0.0

    @property
    def learnt(self) -> bool:
        """The figure is well above what guessing gets (top-1 2x chance, R² > 0.5, mIoU 2x chance)."""
        val = self.train.get("val") or {}
        if self.task == "regress":
            return (val.get("r2") or -1) > 0.5
        if self.task == "detect":  # guessing boxes scores about 0
            return (val.get("map50") or 0) > 0.1
        key = "miou" if self.task == "segment" else "top1"
        return (val.get(key) or 0) > 2 * self.chance

    def format_summary(self) -> str:
        """The human summary ``stoker demo`` prints."""
        t, b = self.train, self.loader
        val = t.get("val") or {}
        verdict = "learnt" if self.learnt else "NOT clearly learnt"
        peer = {
            "classify": "torchvision",
            "regress": "a CSV Dataset",
            "segment": "a (PIL, mask) Dataset",
            "detect": "the decode-only ceiling",
        }[self.task]
        if self.task == "detect":
            figure = (
                f"mAP@50 {100 * (val.get('map50') or 0):.1f}% (COCO mAP {100 * (val.get('map') or 0):.1f}%; "
                "guessing about 0)"
            )
        elif self.task == "regress":
            figure = f"R² {val.get('r2', float('nan')):.3f} (MSE {val.get('mse', float('nan')):.4f}; 0 is the mean)"
        elif self.task == "segment":
            figure = (
                f"mIoU {100 * (val.get('miou') or 0):.1f}% (pixel accuracy {100 * (val.get('pixel_acc') or 0):.1f}%; "
                f"background everywhere {100 * self.chance:.1f}%)"
            )
        else:
            figure = (
                f"top-1 {100 * (val.get('top1') or 0):.1f}% (top-5 {100 * (val.get('top5') or 0):.1f}%, chance "
                f"{100 * self.chance:.1f}%)"
            )
        return "\n".join(
            [
                "",
                f"stoker demo ({self.task}): summary",
                f"  packed        {self.packed['train']:,} train + {self.packed['val']:,} val images, "
                f"{self.rejected} rejected (listed in {Path(self.shards) / 'rejects.jsonl'})",
                f"  loader        stoker {b['stoker_images_per_s']:,.0f} img/s ({b['stoker_backend']}) vs {peer} "
                f"{b['torchvision_images_per_s']:,.0f} img/s: {b['speedup']:.1f}x",
                f"  training      {t['images_per_s'] or 0:,.0f} img/s on {t['device']} (amp {t['amp']}), "
                f"data wait {100 * (t['data_wait'] or 0):.0f}% of train time, "
                f"{t['steps']} steps in {t['seconds']:.0f} s",
                f"  val           {figure}: {verdict}",
                f"  run           {self.run}",
                f"  total         {self.seconds:.0f} s",
            ]
        )


def demo(
    *,
    cache: str | Path | None = None,
    per_class: int = 200,
    epochs: int | None = None,
    batch_size: int = 64,
    crop: int | None = None,
    device: str = "auto",
    bench_seconds: float = 8.0,
    tiny: bool = False,
    say: Callable[[str], None] | None = None,
    task: str = "classify",
) -> DemoResult:
    """Generate a small dataset, pack it, benchmark the loader on it, train on it.

    The dataset and shards are cached in ``cache`` and reused; each call trains anew.

    Args:
        cache: Where data, shards and runs go (None: :func:`default_cache`).
        per_class: Training images per class (val gets a fifth, at least 4); ``regress`` makes
            three times as many pictures, ``segment`` as many.
        epochs: Training epochs (None: 4 to classify, 12 to regress, 8 to segment, 12 to detect).
        batch_size: Batch size of the benchmark and of training (segment: at most 16).
        crop: Crop side (None: 224 on a GPU, 64 on the CPU).
        device: ``"auto"``, ``"cpu"`` or ``"cuda"``.
        bench_seconds: Time per loader measured.
        tiny: A smoke run of a few seconds: 12 per class, 1 epoch, 1 s per loader, batch <= 16.
        say: Called with a line as each of the four steps starts.
        task: ``"classify"``, ``"regress"`` (float targets), ``"segment"`` (grayscale images and
            masks) or ``"detect"`` (pictures of shapes with their boxes, in COCO JSON).

    Returns:
        The :class:`DemoResult`.

    Raises:
        UsageError: A setting below 1, a cache folder that cannot be made, or a loader that fails.
    """
    from stoker.pipeline.deps import has_cuda

    say = say or (lambda line: None)
    if task not in DEMO_TASKS:
        raise UsageError(f"{arg('task')} {task!r} must be one of {', '.join(DEMO_TASKS)}")
    epochs = epochs if epochs is not None else {"classify": 4, "regress": 12, "segment": 8, "detect": 12}[task]
    if tiny:
        per_class, epochs, bench_seconds, batch_size = 12, 1, 1.0, min(batch_size, 16)
    if task in ("segment", "detect"):
        batch_size = min(batch_size, 16)
    for name, value in (("per-class", per_class), ("epochs", epochs), ("batch-size", batch_size)):
        if value < 1:
            raise UsageError(f"--{name} must be >= 1, got {value}")
    gpu = device.startswith("cuda") or (device == "auto" and has_cuda())
    crop = crop or (224 if gpu else 64)
    cache = Path(cache or default_cache()).expanduser()
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"cannot create cache directory {cache}: {e.strerror}") from None
    t0 = time.perf_counter()
    data = _PREPARE[task](cache, per_class, say)
    say(f"[3/4] loader benchmark ({bench_seconds:g} s each, crop {crop}, batch {batch_size})")
    loader = _bench(
        data["bench_split"],
        data["bench_images"],
        masks=data.get("bench_masks"),
        peer=data["peer"],
        crop=crop,
        batch_size=batch_size,
        seconds=bench_seconds,
        channels=data["channels"],
    )
    say(f"[4/4] train {data['arch']}, {epochs} epoch(s)")
    run_dir = cache / "runs" / time.strftime("%Y%m%d-%H%M%S")
    try:
        summary = _train(
            data=str(data["shards"]),
            out=str(run_dir),
            arch=data["arch"],
            epochs=epochs,
            batch_size=batch_size,
            crop=crop,
            device=device,
            seed=0,
            warmup_epochs=min(1.0, epochs / 4),
            lr=None if tiny else data["lr"],
            optimizer=data.get("optimizer", "sgd"),
            channels=data["channels"],
            scale=data.get("scale", (0.08, 1.0)),
            amp=data.get("amp", "auto"),
            progress=sys.stderr.isatty(),
            log_every=10,
        )
    except FloatingPointError as e:  # a diverging loss: the run failed, in one line
        raise CheckFailedError(str(e)) from None
    keys = ("images_per_s", "data_wait", "val", "val_top1", "val_top5", "val_samples", "train_loss")
    keys += ("steps", "seconds", "device", "amp")
    packed = data["packed"]
    return DemoResult(
        images=str(data["images"]),
        shards=str(data["shards"]),
        run=str(run_dir),
        packed={split: t["samples"] for split, t in packed.splits.items()},
        rejected=packed.rejected,
        loader=loader,
        train={k: summary.get(k) for k in keys},
        chance_top1=data["chance"] if task == "classify" else None,
        seconds=time.perf_counter() - t0,
        task=task,
        chance=data["chance"],
    )


def _train(**config):
    from stoker.model.train import TrainConfig, train

    return train(TrainConfig(**config))


def _prepare_classify(cache: Path, per_class: int, say: Callable[[str], None]) -> dict:
    from stoker.pipeline.shards.manifest import Manifest

    from .pack import pack

    images, shards = cache / f"images-{per_class}pc", cache / f"shards-{per_class}pc"
    say(f"[1/4] dataset: {images}")
    _generate(images, per_class=per_class, val_per_class=max(4, per_class // 5))
    say(f"[2/4] pack: {shards}")
    packed = pack(images, shards)
    classes = Manifest.load(shards / "train").classes
    # the benchmark on val: torchvision's ImageFolder would crash on the broken files planted in train/
    return dict(
        images=images,
        shards=shards,
        packed=packed,
        bench_split=shards / "val",
        bench_images=images / "val",
        peer="torchvision",
        arch="inception",
        lr=0.05,
        channels=3,
        chance=1 / len(classes),
    )


def _prepare_regress(cache: Path, per_class: int, say: Callable[[str], None]) -> dict:
    from .common.synth import make_regression_csv
    from .pack import pack

    n = 3 * per_class
    root, shards = cache / f"regress-{n}", cache / f"regress-{n}-shards"
    say(f"[1/4] dataset: {root} ({n} pictures whose colour temperature is their target)")
    csv = root / "targets.csv"
    _make_once(root, csv, lambda tmp: make_regression_csv(tmp, n=n, seed=0))
    say(f"[2/4] pack: {shards}")
    packed = pack(csv, shards, val_fraction=0.2)
    return dict(
        images=csv,
        shards=shards,
        packed=packed,
        bench_split=shards / "train",
        bench_images=csv,
        peer="torchvision-csv",
        arch="inception",
        lr=2e-3,
        optimizer="adamw",
        channels=3,
        chance=0.0,
    )


def _prepare_segment(cache: Path, per_class: int, say: Callable[[str], None]) -> dict:
    import numpy as np
    from PIL import Image

    from .common.synth import make_segmentation_tree
    from .pack import Masks, pack

    n = per_class
    root, shards = cache / f"segment-{n}", cache / f"segment-{n}-shards"
    say(f"[1/4] dataset: {root} ({n} grayscale pictures of textured shapes, and their masks)")
    _make_once(root, root / "masks", lambda tmp: make_segmentation_tree(tmp, n=n, seed=0))
    say(f"[2/4] pack: {shards}")
    packed = pack(root / "images", shards, masks=Masks(root / "masks", num_classes=4), val_fraction=0.2)
    counts = np.zeros(4)
    for path in sorted((root / "masks").glob("*.png")):
        counts += np.bincount(np.asarray(Image.open(path)).ravel(), minlength=4)[:4]
    return dict(
        images=root / "images",
        shards=shards,
        packed=packed,
        bench_split=shards / "train",
        bench_images=root / "images",
        bench_masks=root / "masks",
        peer="torchvision-seg",
        arch="inception",
        lr=3e-3,
        optimizer="adamw",
        channels=1,
        scale=(0.25, 1.0),
        chance=float(counts[0] / counts.sum()) / 4,  # mIoU of calling every pixel background
    )


def _prepare_detect(cache: Path, per_class: int, say: Callable[[str], None]) -> dict:
    from .common.synth import make_detection_scenes
    from .pack import pack

    n, val = max(32, per_class + per_class // 5), max(8, per_class // 4)  # a batch of 16 twice, at least
    root, shards = cache / f"detect-{n}", cache / f"detect-{n}-shards"
    say(f"[1/4] dataset: {root} ({n} + {val} pictures of shapes with their exact boxes, COCO JSON)")
    _make_once(
        root,
        root / "coco",
        lambda tmp: make_detection_scenes(tmp, n=n, val=val, seed=0, min_side=56, max_side=72, formats=("coco",)),
    )
    say(f"[2/4] pack: {shards}")
    packed = pack(root / "coco", shards)
    return dict(
        images=root / "coco",
        shards=shards,
        packed=packed,
        bench_split=shards / "train",
        bench_images=None,
        peer="ceiling",
        arch="fcos_tiny",
        lr=3e-3,
        optimizer="adamw",
        channels=3,
        scale=(0.5, 1.0),
        # on a CPU, float32: its bf16 convolutions ran 4x slower (103 s against 24 s, 2026-12-06)
        amp="off" if not _gpu_wanted() else "auto",
        chance=0.0,
    )


def _gpu_wanted() -> bool:
    from stoker.pipeline.deps import has_cuda

    return has_cuda()


_PREPARE = {
    "classify": _prepare_classify,
    "regress": _prepare_regress,
    "segment": _prepare_segment,
    "detect": _prepare_detect,
}


def _bench(
    shards: Path,
    images: Path,
    *,
    peer: str,
    crop: int,
    batch_size: int,
    seconds: float,
    masks: Path | None = None,
    channels: int = 3,
) -> dict:
    """stoker's Loader vs the usual PyTorch pipeline of the task, side by side (`stoker bench`)."""
    from stoker.pipeline.deps import HAS_DALI

    from .bench.loader import bench

    ours = "stoker-dali" if HAS_DALI else "stoker-pil"
    result = bench(
        shards,
        images=images,
        masks=masks,
        channels=channels,
        only=[peer, ours],
        crop=crop,
        batch_size=batch_size,
        seconds=seconds,
        epochs=3,
        warmup=1,
        progress=True,
    )
    rows = {r["pipeline"]: r for r in result.rows}
    for r in rows.values():
        if "img_s" not in r:
            raise UsageError(f"loader benchmark failed ({r['label']}): {r.get('error')}")
    base, mine = rows[peer]["img_s"], rows[ours]["img_s"]
    return {
        "torchvision_images_per_s": base,
        "stoker_images_per_s": mine,
        "stoker_backend": ours.split("-")[1],
        "speedup": mine / base,
    }


def main(args: argparse.Namespace) -> int:
    result = demo(
        cache=args.cache,
        per_class=args.per_class,
        epochs=args.epochs,
        batch_size=args.batch_size,
        crop=args.crop,
        device=args.device,
        bench_seconds=args.bench_seconds,
        tiny=args.tiny,
        say=lambda line: print(line, flush=True),
        task=args.task,
    )
    print(json.dumps(result.to_dict(), indent=1) if args.json else result.format_summary())
    return 0
