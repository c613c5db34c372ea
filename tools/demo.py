"""The main job on a built-in dataset: generate → pack → benchmark the loader → train.

Generates a small procedural classification dataset (six pattern classes, mixed sizes,
some grayscale, CMYK, PNG and broken files) into a cache directory, packs it with
``stoker pack``, measures stoker's Loader against the torchvision ImageFolder
baseline on the same images, trains the inception-block network for a few epochs, and
prints a summary. The dataset and shards are cached and reused; each run trains anew.
Uses the GPU when there is one; under 5 minutes on a 2-core CPU.

examples:
  stoker demo
  stoker demo --epochs 8 --per-class 400
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

from stoker.errors import UsageError

from .common.results import Result

HELP = "the main job on a built-in dataset: generate, pack, benchmark the loader, train, summarize"


def default_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "stoker" / "demo"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--cache", type=Path, default=None, help=f"where data, shards and runs go (default: {default_cache()})"
    )
    p.add_argument("--per-class", type=int, default=200, help="training images per class (default: %(default)s)")
    p.add_argument("--epochs", type=int, default=4, help="training epochs (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=64, help="(default: %(default)s)")
    p.add_argument("--crop", type=int, default=None, help="crop side (default: 224 on a GPU, 64 on the CPU)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda (default: auto)")
    p.add_argument("--bench-seconds", type=float, default=8.0, help="time per loader measured (default: %(default)s)")
    p.add_argument("--tiny", action="store_true", help="tiny settings: a smoke run of a few seconds")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")


def _generate(images: Path, *, per_class: int, val_per_class: int) -> None:
    """Write SRC = images/{train,val}/<class>/ once; a crash leaves no half dataset."""
    from .common.synth import make_image_folder

    if (images / "train").is_dir():
        return
    tmp = images.with_name(images.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    make_image_folder(tmp / "train", per_class=per_class, seed=0, nasty=True)
    make_image_folder(tmp / "val", per_class=val_per_class, seed=1)
    os.replace(tmp, images)


@dataclasses.dataclass
class DemoResult(Result):
    """What :func:`demo` did; :meth:`to_dict` is ``stoker demo --json``.

    Attributes:
        images: The generated ImageFolder (``train/``, ``val/``).
        shards: Where it was packed.
        run: The training run folder (checkpoints, metrics).
        packed: Images packed per split (``train``, ``val``).
        rejected: Inputs listed in ``rejects.jsonl``.
        loader: stoker's Loader against torchvision ImageFolder: ``torchvision_images_per_s``,
            ``stoker_images_per_s``, ``stoker_backend``, ``speedup``.
        train: From the training summary: ``images_per_s``, ``data_wait``, ``val_top1``,
            ``val_top5``, ``val_samples``, ``train_loss``, ``steps``, ``seconds``, ``device``, ``amp``.
        chance_top1: Top-1 of guessing (1 / classes).
        seconds: The whole run.
    """

    images: str
    shards: str
    run: str
    packed: dict
    rejected: int
    loader: dict
    train: dict
    chance_top1: float
    seconds: float

    def format_summary(self) -> str:
        """The human summary ``stoker demo`` prints."""
        t, b = self.train, self.loader
        top1 = t["val_top1"]
        verdict = "above chance" if top1 is not None and top1 > 2 * self.chance_top1 else "NOT clearly above chance"
        return "\n".join(
            [
                "",
                "stoker demo: summary",
                f"  packed        {self.packed['train']:,} train + {self.packed['val']:,} val images, "
                f"{self.rejected} rejected (listed in {Path(self.shards) / 'rejects.jsonl'})",
                f"  loader        stoker {b['stoker_images_per_s']:,.0f} img/s ({b['stoker_backend']}) vs torchvision "
                f"{b['torchvision_images_per_s']:,.0f} img/s: {b['speedup']:.1f}x",
                f"  training      {t['images_per_s'] or 0:,.0f} img/s on {t['device']} (amp {t['amp']}), "
                f"data wait {100 * (t['data_wait'] or 0):.0f}% of train time, "
                f"{t['steps']} steps in {t['seconds']:.0f} s",
                f"  val top-1     {100 * (top1 or 0):.1f}% (top-5 {100 * (t['val_top5'] or 0):.1f}%, chance "
                f"{100 * self.chance_top1:.1f}%): {verdict}",
                f"  run           {self.run}",
                f"  total         {self.seconds:.0f} s",
            ]
        )


def demo(
    *,
    cache: str | Path | None = None,
    per_class: int = 200,
    epochs: int = 4,
    batch_size: int = 64,
    crop: int | None = None,
    device: str = "auto",
    bench_seconds: float = 8.0,
    tiny: bool = False,
    say: Callable[[str], None] | None = None,
) -> DemoResult:
    """Generate a small dataset, pack it, benchmark the loader on it, train on it.

    The dataset and shards are cached in ``cache`` and reused; each call trains anew.

    Args:
        cache: Where data, shards and runs go (None: :func:`default_cache`).
        per_class: Training images per class (val gets a fifth, at least 4).
        epochs: Training epochs.
        batch_size: Batch size of the benchmark and of training.
        crop: Crop side (None: 224 on a GPU, 64 on the CPU).
        device: ``"auto"``, ``"cpu"`` or ``"cuda"``.
        bench_seconds: Time per loader measured.
        tiny: A smoke run of a few seconds: 12 per class, 1 epoch, 1 s per loader, batch <= 16.
        say: Called with a line as each of the four steps starts.

    Returns:
        The :class:`DemoResult`.

    Raises:
        UsageError: A setting below 1, a cache folder that cannot be made, or a loader that fails.
    """
    from stoker.model.train import TrainConfig, train
    from stoker.pipeline.deps import has_cuda
    from stoker.pipeline.shards.manifest import Manifest

    from .pack import pack

    say = say or (lambda line: None)
    if tiny:
        per_class, epochs, bench_seconds, batch_size = 12, 1, 1.0, min(batch_size, 16)
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
    images, shards = cache / f"images-{per_class}pc", cache / f"shards-{per_class}pc"
    t0 = time.perf_counter()

    say(f"[1/4] dataset: {images}")
    _generate(images, per_class=per_class, val_per_class=max(4, per_class // 5))

    say(f"[2/4] pack: {shards}")
    packed = pack(images, shards)
    classes = Manifest.load(shards / "train").classes

    say(f"[3/4] loader benchmark ({bench_seconds:g} s each, crop {crop}, batch {batch_size})")
    # On val: torchvision's ImageFolder would crash on the broken files planted in train/.
    loader = _bench(shards / "val", images / "val", crop=crop, batch_size=batch_size, seconds=bench_seconds)

    say(f"[4/4] train the inception-block network, {epochs} epoch(s)")
    run_dir = cache / "runs" / time.strftime("%Y%m%d-%H%M%S")
    summary = train(
        TrainConfig(
            data=str(shards),
            out=str(run_dir),
            arch="inception",
            epochs=epochs,
            batch_size=batch_size,
            crop=crop,
            device=device,
            seed=0,
            warmup_epochs=min(1.0, epochs / 4),
            lr=0.05 if not tiny else None,
            progress=sys.stderr.isatty(),
            log_every=10,
        )
    )
    keys = (
        "images_per_s",
        "data_wait",
        "val_top1",
        "val_top5",
        "val_samples",
        "train_loss",
        "steps",
        "seconds",
        "device",
        "amp",
    )
    return DemoResult(
        images=str(images),
        shards=str(shards),
        run=str(run_dir),
        packed={split: t["samples"] for split, t in packed.splits.items()},
        rejected=packed.rejected,
        loader=loader,
        train={k: summary.get(k) for k in keys},
        chance_top1=1 / len(classes),
        seconds=time.perf_counter() - t0,
    )


def _bench(shards: Path, images: Path, *, crop: int, batch_size: int, seconds: float) -> dict:
    """stoker's Loader vs the torchvision ImageFolder baseline, side by side (`stoker bench`)."""
    from stoker.pipeline.deps import HAS_DALI

    from .bench.loader import bench

    ours = "stoker-dali" if HAS_DALI else "stoker-pil"
    result = bench(
        shards,
        images=images,
        only=["torchvision", ours],
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
    base, mine = rows["torchvision"]["img_s"], rows[ours]["img_s"]
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
    )
    print(json.dumps(result.to_dict(), indent=1) if args.json else result.format_summary())
    return 0
