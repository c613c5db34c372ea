"""Benchmark stoker's Loader against the usual ways of feeding a model, side by side.

Each pipeline runs in a fresh subprocess (clean peak RSS and CPU time), with the same
crop, batch size and training augmentation (RandomResizedCrop + flip), for a warm-up
that is not counted and then up to --epochs epochs or --seconds seconds:

  (1) torchvision ImageFolder + PIL + DataLoader(num_workers=cores), float32 normalized
      (only with --images: the original files)
  (2) webdataset + PIL + DataLoader on the shards, uint8
  (3) DALI's own fn.readers.webdataset graph on the shards (buffer shuffle), uint8
  (4) FFCV, when importable (here, or in --ffcv-python), from a .beton of --images: JPEG
      (``ffcv``) and decoded pixels (``ffcv-raw``, its ``write_mode="raw"``)
  (5) stoker Loader, once per available backend (nvjpeg: decoded on the GPU, batches on
      the GPU; skipped without CUDA)
  (6) with --pixel-cache DIR: the Loader's decoded-pixel tier in a fresh folder under DIR,
      its filling first epoch and the epochs after it (cropped from decoded pixels)
  and the decode-only ceiling: every image of the shards decoded once by `cores`
  processes, nothing else.

Columns: images/s, ratio to (1) (or to (2) without --images), CPU % (all processes of
the pipeline; 200% = two cores busy), CPU seconds per 1,000 images (what a node's cores
per GPU must supply at a given speed), peak RSS (sum over the pipeline's processes; shared
pages count once per process), bytes per batch handed to the device.

The summary line puts the best stoker Loader against the others; when (1) and (2) both
ran it splits the gain over (1) in two factors whose product it is: pack-time resize,
(2) on the shards (already resized by `stoker pack`) over (1) on the originals, and the
Loader itself, the best stoker over (2) on the same shards.

examples:
  stoker bench /data/packed/train --images /data/imagenet/train
  stoker bench out/train --json --seconds 10
  stoker bench out/train --images src --plot bench.png
"""

# One module past 400 lines: bench(), its result table and the flags; the pipelines it times
# are in bench_runners.py and peers/.

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from stoker.errors import UsageError, arg
from stoker.pipeline.backends import backend_names, backends

from ..common.loader_flags import add_crop_flags
from ..common.results import Result
from .peers import ffcv_bench
from .runners import torchvision_loader

__all__ = ["bench", "BenchResult", "summarize", "torchvision_loader", "ALL", "LABELS"]

HELP = "side-by-side loader throughput: torchvision, webdataset, DALI reader, FFCV, stoker"

#: one row per decode backend of the registry (stoker.pipeline.backends)
STOKER = tuple(f"stoker-{name}" for name in backend_names(auto=False))
ALL = ("torchvision", "wds", "dali-reader", "ffcv", "ffcv-raw", *STOKER, "ceiling")
#: the pixel tier's rows (measured with --pixel-cache DIR)
PIXELS = ("stoker-pixels-fill", "stoker-pixels")
#: FFCV's storage of each FFCV row (``RGBImageField(write_mode=...)``)
FFCV_MODES = {"ffcv": "jpg", "ffcv-raw": "raw"}
#: the pipelines of a split that is not of classes: the usual Dataset of its kind, stoker, the ceiling
OF_KIND = {
    "mask": ("torchvision-seg", *STOKER, "ceiling"),
    "float": ("torchvision-csv", *STOKER, "ceiling"),
    "multilabel": (*STOKER, "ceiling"),
}
#: the peers that read a class split's cls members (or an ImageFolder) only
CLASS_ONLY = ("torchvision", "wds", "dali-reader", "ffcv", "ffcv-raw")
#: the baseline rows, in order of preference
BASELINES = ("torchvision", "torchvision-seg", "torchvision-csv", "wds")
LABELS = {
    "torchvision": "(1) torchvision ImageFolder+PIL",
    "torchvision-seg": "(1) (PIL image, PIL mask) Dataset, v2 joint crop",
    "torchvision-csv": "(1) CSV Dataset+PIL, float targets",
    "wds": "(2) webdataset+PIL",
    "dali-reader": "(3) DALI fn.readers.webdataset",
    "ffcv": "(4) FFCV (JPEG)",
    "ffcv-raw": "(4) FFCV (raw pixels)",
    **{
        f"stoker-{b.name}": f"(5) stoker Loader ({b.name}{', GPU' if 'cpu' not in b.where else ''})" for b in backends()
    },
    "stoker-dali-dali-resize": "(5) stoker Loader (dali, fn.resize)",
    "stoker-pixels": "(6) stoker pixel tier, warm",
    "stoker-pixels-fill": "(6) stoker pixel tier, filling epoch",
    "ceiling": "decode-only ceiling",
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("data", metavar="DATA", help="a packed split (or a dataset root with train/), local or a URL")
    p.add_argument(
        "--storage-option",
        action="append",
        default=None,
        metavar="K=V",
        help="fsspec storage option for a URL DATA, repeatable (e.g. endpoint_url=http://minio:9000)",
    )
    p.add_argument(
        "--images",
        metavar="SRC",
        help="the original images, for (1) and (4): the ImageFolder tree; a mask split's image folder "
        "(with --masks); a float split's CSV",
    )
    p.add_argument("--masks", metavar="MASKS", help="a mask split's original mask folder, for (1)")
    p.add_argument("--channels", type=int, choices=(1, 3), default=3, help="3 (RGB, default) or 1 (grayscale)")
    p.add_argument("--batch-size", type=int, default=64, help="default 64")
    add_crop_flags(p, recipe=False)
    p.add_argument("--epochs", type=int, default=3, help="measured epochs per pipeline (default 3)")
    p.add_argument(
        "--seconds", type=float, default=30.0, help="stop a pipeline's measurement after this long (default 30)"
    )
    p.add_argument(
        "--warmup", type=int, default=3, metavar="BATCHES", help="batches run before timing starts (default 3)"
    )
    p.add_argument("--workers", type=int, default=0, help="workers / threads per pipeline (default: cores)")
    p.add_argument(
        "--only",
        default="",
        metavar="LIST",
        help="comma-separated subset of: " + ",".join(ALL) + ",stoker-dali-dali-resize",
    )
    p.add_argument(
        "--repeat", type=int, default=1, help="rounds over all pipelines; each row reports its best round (default 1)"
    )
    p.add_argument("--ffcv-python", metavar="PATH", help="a python with ffcv installed, for column (4)")
    p.add_argument(
        "--pixel-cache",
        metavar="DIR",
        help="also measure the pixel tier (6), its store in a fresh folder under DIR (node-local disk or "
        "/dev/shm; removed after): the filling epoch and the warm ones",
    )
    p.add_argument(
        "--ffcv-max-resolution",
        type=int,
        default=256,
        metavar="R",
        help="FFCV max_resolution when writing its .beton (default 256)",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.add_argument("--plot", metavar="FILE.png", help="also draw a bar chart (needs matplotlib)")


# ---- parent ---------------------------------------------------------------------------------


def _measure(kind: str, cfg: dict, python: str = sys.executable) -> dict:
    """One pipeline in a fresh subprocess; its ``RESULT`` dict, or ``{"error": last stderr line}``."""
    cfg = {**cfg, "kind": kind}
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if kind in FFCV_MODES:  # by file path: the ffcv python need not have stoker
        cmd = [python, ffcv_bench.__file__, json.dumps(cfg)]
    else:
        cmd = [python, "-m", "stoker.tools.bench.runners", json.dumps(cfg)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return {"error": tail[:200]}


def _stoker_runs(kind: str, why: bool = False):
    """Can the Loader row ``stoker-<backend>`` run here (on the GPU when the backend decodes only
    there)? With ``why``: the registry's reason."""
    from stoker.pipeline.backends import get_backend

    backend = get_backend(kind.removeprefix("stoker-"))
    device = "cpu" if "cpu" in backend.where else "cuda"
    ok, reason = backend.available(device, decoder="auto")
    return reason if why else ok


def _ffcv_python(ffcv_python: str | None) -> str | None:
    for py in [ffcv_python] if ffcv_python else [sys.executable]:
        try:
            if subprocess.run([py, "-c", "import ffcv"], capture_output=True, timeout=120).returncode == 0:
                return py
        except (OSError, subprocess.TimeoutExpired):
            pass
    return None


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


@dataclasses.dataclass
class BenchResult(Result):
    """What `stoker bench` measured; :meth:`to_dict` is its ``--json`` output.

    Attributes:
        data: The packed split measured.
        images: The original ImageFolder, or None.
        batch_size: Batch size of every pipeline.
        crop: Crop of every pipeline: a side, or ``(height, width)``.
        workers: Workers / threads per pipeline.
        epochs: Measured epochs per pipeline (at most).
        seconds_limit: Time limit per pipeline.
        baseline: ``"torchvision"``, ``"wds"`` or None: what ``ratio`` is relative to.
        rows: One dict per pipeline run: ``pipeline``, ``label``, then ``images``, ``seconds``,
            ``img_s``, ``cpu_pct``, ``cpu_s_per_1k``, ``peak_rss``, ``bytes_per_batch`` and
            ``ratio``, or ``error``.
        summary: The best stoker Loader against the others: ``vs_torchvision``,
            ``vs_dali_reader``, ``vs_ffcv``, ``vs_ffcv_raw``, ``of_ceiling`` (those measured); with (1) and (2)
            both measured, ``vs_torchvision`` split in two factors (:func:`summarize`):
            ``from_pack_resize`` and ``from_loader``. With the pixel tier measured: ``pixels_vs_ffcv_raw``,
            ``pixels_vs_ffcv`` (warm) and ``fill_vs_jpeg`` (its filling epoch over the best JPEG row).
        notes: Why a pipeline was skipped, one line each.
    """

    data: str
    images: str | None
    batch_size: int
    crop: int | tuple
    workers: int
    epochs: int
    seconds_limit: float
    baseline: str | None
    rows: list
    summary: dict
    notes: list

    def format_table(self) -> str:
        """The human table ``stoker bench`` prints."""
        base = self.baseline
        nvjpeg = any(r["pipeline"] == "stoker-nvjpeg" for r in self.rows)
        lines = [
            f"stoker bench {self.data}: batch {self.batch_size}, crop {self.crop}, "
            f"{self.workers} workers/threads, device cpu" + (" (nvjpeg: cuda)" if nvjpeg else ""),
            f"{'pipeline':<38} {'img/s':>8} {'vs ' + ('(1)' if base == 'torchvision' else '(2)'):>7} "
            f"{'CPU %':>6} {'CPU s/1k':>8} {'peak RSS':>9} {'bytes/batch':>12}",
        ]
        for r in self.rows:
            if "error" in r:
                lines.append(f"{r['label']:<38} failed: {r['error']}")
                continue
            ratio = f"{r['ratio']:.2f}x" if "ratio" in r else "-"
            bpb = _fmt_bytes(r["bytes_per_batch"]) if r["bytes_per_batch"] else "-"
            per_1k = f"{r['cpu_s_per_1k']:.2f}" if r.get("cpu_s_per_1k") is not None else "-"
            lines.append(
                f"{r['label']:<38} {r['img_s']:>8.0f} {ratio:>7} {r['cpu_pct']:>5.0f}% {per_1k:>8} "
                f"{_fmt_bytes(r['peak_rss']):>9} {bpb:>12}"
            )
        s = self.summary
        if s:
            parts = {
                "vs_torchvision": "x torchvision",
                "vs_dali_reader": "x DALI reader",
                "vs_ffcv": "x FFCV (JPEG)",
                "vs_ffcv_raw": "x FFCV (raw)",
            }
            text = [f"{s[k]:.2f}{v}" for k, v in parts.items() if k in s]
            if "of_ceiling" in s:
                text.append(f"{100 * s['of_ceiling']:.0f}% of the decode-only ceiling")
            if text:
                lines.append("best stoker Loader: " + ", ".join(text))
            pixels = {"pixels_vs_ffcv_raw": "x FFCV (raw)", "pixels_vs_ffcv": "x FFCV (JPEG)"}
            if any(k in s for k in pixels):
                lines.append("pixel tier, warm: " + ", ".join(f"{s[k]:.2f}{v}" for k, v in pixels.items() if k in s))
            if "fill_vs_jpeg" in s:
                lines.append(f"pixel tier, filling epoch: {s['fill_vs_jpeg']:.2f}x the best stoker Loader (JPEG)")
            if "from_pack_resize" in s:
                # The headline vs torchvision is the product of these two: say how much each brings.
                lines += [
                    f"  {s['vs_torchvision']:.2f}x = pack-time resize: {s['from_pack_resize']:.2f}x "
                    "((2) webdataset on the shards / (1) torchvision on the originals)",
                    f"  {'':>{len(format(s['vs_torchvision'], '.2f'))}}  x Loader: {s['from_loader']:.2f}x "
                    "(best stoker / (2) webdataset on the same shards)",
                ]
        lines += self.notes
        return "\n".join(lines)

    def plot(self, path: str) -> None:
        """Draw the images/s of each pipeline as a bar chart into ``path`` (needs matplotlib)."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        rows = [r for r in self.rows if "img_s" in r]
        fig, ax = plt.subplots(figsize=(8, 0.5 * len(rows) + 1.5))
        colors = [
            "tab:orange"
            if r["pipeline"].startswith("stoker")
            else "tab:gray"
            if r["pipeline"] == "ceiling"
            else "tab:blue"
            for r in rows
        ]
        ax.barh([r["label"] for r in rows][::-1], [r["img_s"] for r in rows][::-1], color=colors[::-1])
        for k, r in enumerate(rows[::-1]):
            ax.text(r["img_s"], k, f" {r['img_s']:.0f}", va="center")
        ax.set_xlabel("images / s")
        ax.set_title(f"batch {self.batch_size}, crop {self.crop}, {self.workers} cores, cpu")
        fig.tight_layout()
        fig.savefig(path, dpi=120)


def summarize(rows: list) -> dict:
    """The best stoker Loader against the other rows (those that ran): see :attr:`BenchResult.summary`.

    ``vs_torchvision`` mixes two gains: the shards were resized at pack time, and then the
    Loader reads them. With torchvision (1) and webdataset (2) both measured it is split into
    ``from_pack_resize`` = (2) / (1) and ``from_loader`` = best stoker / (2), whose product it is.
    """
    rate = {r["pipeline"]: r["img_s"] for r in rows if "img_s" in r}
    best = max((rate[k] for k in STOKER if k in rate), default=None)
    summary = {}
    if not best:
        return summary
    for k, name in (
        ("torchvision", "vs_torchvision"),
        ("torchvision-seg", "vs_torchvision"),
        ("torchvision-csv", "vs_torchvision"),
        ("dali-reader", "vs_dali_reader"),
        ("ceiling", "of_ceiling"),
        ("ffcv", "vs_ffcv"),
        ("ffcv-raw", "vs_ffcv_raw"),
    ):
        if k in rate:
            summary[name] = best / rate[k]
    if "torchvision" in rate and "wds" in rate:
        summary["from_pack_resize"] = rate["wds"] / rate["torchvision"]
        summary["from_loader"] = best / rate["wds"]
    if "stoker-pixels" in rate:  # the pixel tier, warm, against FFCV's two storages
        for k, name in (("ffcv-raw", "pixels_vs_ffcv_raw"), ("ffcv", "pixels_vs_ffcv")):
            if k in rate:
                summary[name] = rate["stoker-pixels"] / rate[k]
    if "stoker-pixels-fill" in rate:  # its filling epoch against the JPEG path
        summary["fill_vs_jpeg"] = rate["stoker-pixels-fill"] / best
    return summary


def _split(data: str | Path, storage_options: dict | None = None) -> Path:
    from stoker.errors import ManifestError
    from stoker.pipeline.cache import local_copy, read_manifest
    from stoker.pipeline.shards.manifest import MANIFEST_NAME
    from stoker.pipeline.shards.paths import check_path
    from stoker.pipeline.storage import is_url

    if is_url(data):  # fetched whole into the shard cache first; every pipeline then reads it
        url = str(data).rstrip("/")
        try:
            read_manifest(url, storage_options)
        except ManifestError:
            url += "/train"
        return local_copy(url, storage_options)
    split = Path(data)
    check_path(split, "pack")  # the line every command gives a wrong path
    if not (split / MANIFEST_NAME).exists() and (split / "train" / MANIFEST_NAME).exists():
        split = split / "train"
    if not (split / MANIFEST_NAME).exists():
        raise UsageError(f"{data} has no {MANIFEST_NAME} (pack it with `stoker pack`)")
    return split


def _plan(
    only: Sequence[str],
    *,
    images: str | None,
    ffcv_python: str | None,
    masks: str | None = None,
    target: str = "class",
    pixel_cache: str | None = None,
) -> tuple[list, list]:
    """``([(kind, python), ...] to run, [notes on the kinds skipped])``."""
    from stoker.pipeline.deps import HAS_DALI

    notes, plan = [], []
    for kind in only:
        if kind in CLASS_ONLY and target != "class":
            notes.append(f"{LABELS[kind]}: skipped (it reads class labels; the split's targets are {target})")
        elif kind == "torchvision" and not images:
            notes.append("(1) torchvision: skipped (give --images SRC, the original ImageFolder)")
        elif kind == "torchvision-seg" and not (images and masks):
            notes.append(f"{LABELS[kind]}: skipped (give --images IMAGES --masks MASKS, the original folders)")
        elif kind == "torchvision-csv" and not (images and Path(images).is_file()):
            notes.append(f"{LABELS[kind]}: skipped (give --images CSV, the original list of path,value)")
        elif kind in ("dali-reader", "stoker-dali-dali-resize") and not HAS_DALI:
            notes.append(f"{LABELS[kind]}: skipped (nvidia-dali not installed)")
        elif kind in PIXELS and not pixel_cache:
            notes.append(f"{LABELS[kind]}: skipped (give --pixel-cache DIR, where its store may go)")
        elif kind in STOKER and not _stoker_runs(kind):
            notes.append(f"{LABELS[kind]}: skipped ({_stoker_runs(kind, why=True)})")
        elif kind in FFCV_MODES:
            py = _ffcv_python(ffcv_python) if images else None
            if not images:
                notes.append(f"{LABELS[kind]}: skipped (needs --images to write its .beton)")
            elif py is None:
                notes.append(
                    f"{LABELS[kind]}: not installed (pip install ffcv needs libopencv-dev and "
                    "libturbojpeg0-dev; or point --ffcv-python at a python that has it)"
                )
            else:
                plan.append((kind, py))
        else:
            plan.append((kind, sys.executable))
    return plan, notes


def bench(
    data: str | Path,
    *,
    images: str | Path | None = None,
    batch_size: int = 64,
    crop: int | tuple[int, int] = 224,
    epochs: int = 3,
    seconds: float = 30.0,
    warmup: int = 3,
    workers: int | None = None,
    only: Sequence[str] | None = None,
    repeat: int = 1,
    ffcv_python: str | None = None,
    ffcv_max_resolution: int = 256,
    pixel_cache: str | Path | None = None,
    progress: bool = False,
    storage_options: dict | None = None,
    masks: str | Path | None = None,
    channels: int = 3,
) -> BenchResult:
    """Measure stoker's Loader and the usual loaders side by side, each in a fresh subprocess.

    Args:
        data: A packed split (with stoker.json), or a dataset root with ``train/``; local or a
            URL (fetched whole into the shard cache first, with ``storage_options``).
        images: The original images, for the torchvision and FFCV pipelines: the ImageFolder; a
            mask split's image folder; a float split's CSV.
        masks: A mask split's original mask folder (the (PIL image, PIL mask) Dataset's).
        channels: 3 (RGB) or 1 (grayscale), for every pipeline that can.
        batch_size: Batch size of every pipeline.
        crop: Crop side (RandomResizedCrop + flip in every pipeline).
        epochs: Measured epochs per pipeline (at most; ``seconds`` may stop it first).
        seconds: Time limit of each pipeline's measurement.
        warmup: Batches run before timing starts.
        workers: Workers / threads per pipeline (None: the usable cores).
        only: Pipelines to run, from :data:`LABELS` (None: all of :data:`ALL`, or for a split that is
            not of classes those of :data:`OF_KIND`).
        repeat: Rounds over all pipelines; each row keeps its best round.
        ffcv_python: A python with ffcv installed (None: this one, if it has ffcv).
        ffcv_max_resolution: FFCV ``max_resolution`` when writing its .beton.
        pixel_cache: a folder for the pixel tier's store (node-local disk or ``/dev/shm``): adds its
            rows (a fresh store per run, removed after): the filling epoch and the warm epochs.
        progress: Show a progress bar on stderr.

    Returns:
        The :class:`BenchResult`; a pipeline that failed has an ``error`` row.

    Raises:
        UsageError: ``data`` is not packed, ``images`` is not a folder, a count is below 1,
            or ``only`` names an unknown pipeline.
    """
    from stoker.pipeline.cache import read_manifest
    from stoker.pipeline.deps import usable_cores

    split = _split(data, storage_options)
    target = read_manifest(str(split), storage_options).target.kind
    _check_inputs(images, masks, target, batch_size=batch_size, crop=crop, epochs=epochs, repeat=repeat)
    images, masks = (str(images) if images else None), (str(masks) if masks else None)
    only = _pipelines(only, target, pixel_cache)
    cores = workers or usable_cores()
    cfg = {
        "data": str(split),
        "images": images,
        "batch_size": batch_size,
        "crop": crop,
        "epochs": epochs,
        "seconds": seconds,
        "warmup": warmup,
        "workers": cores,
        "masks": masks,
        "channels": channels,
        "pixel_cache": str(pixel_cache) if pixel_cache else None,
    }
    if pixel_cache:
        Path(pixel_cache).mkdir(parents=True, exist_ok=True)
    plan, notes = _plan(
        only, images=images, ffcv_python=ffcv_python, masks=masks, target=target, pixel_cache=cfg["pixel_cache"]
    )
    rows = _best_of_rounds(plan, cfg, repeat=repeat, ffcv_max_resolution=ffcv_max_resolution, progress=progress)
    base_kind = next((k for k in BASELINES if "img_s" in rows.get(k, {})), None)
    base = rows[base_kind]["img_s"] if base_kind else None
    out_rows = []
    for kind, _ in plan:
        r = rows[kind]
        row = {"pipeline": kind, "label": LABELS[kind], **r}
        if base and "img_s" in r:
            row["ratio"] = r["img_s"] / base
        out_rows.append(row)
    return BenchResult(
        data=str(split),
        images=images,
        batch_size=batch_size,
        crop=crop,
        workers=cores,
        epochs=epochs,
        seconds_limit=seconds,
        baseline=base_kind,
        rows=out_rows,
        summary=summarize(out_rows),
        notes=notes,
    )


def _check_inputs(images, masks, target: str, *, batch_size: int, crop, epochs: int, repeat: int) -> None:
    """The originals exist and fit the split; every count is at least 1 (:class:`UsageError`)."""
    if images and not Path(images).exists():
        raise UsageError(f"{arg('images', str(images))} does not exist")
    if images and Path(images).is_file() and target != "float":
        raise UsageError(
            f"{arg('images', str(images))} is a file: a CSV is the original of a float split, this one's are {target}"
        )
    if masks and not Path(masks).is_dir():
        raise UsageError(f"{arg('masks', str(masks))} is not a directory")
    sides = [crop] if isinstance(crop, int) else list(crop)
    for name, value in (("batch_size", batch_size), ("crop", min(sides)), ("epochs", epochs), ("repeat", repeat)):
        if value < 1:
            raise UsageError(f"{arg(name)} must be at least 1")


def _pipelines(only: Sequence[str] | None, target: str, pixel_cache) -> list[str]:
    """The pipelines to run: ``only``'s, or every one for the split's kind (the ceiling last)."""
    only = [k for k in only or () if k] or [
        *(k for k in OF_KIND.get(target, ALL if target == "class" else (*STOKER, "ceiling")) if k != "ceiling"),
        *(PIXELS if pixel_cache else ()),
        "ceiling",
    ]
    unknown = set(only) - set(LABELS)
    if unknown:
        raise UsageError(f"{arg('only')}: unknown pipeline(s) {sorted(unknown)}; choose from {', '.join(LABELS)}")
    return only


def _best_of_rounds(plan: list, cfg: dict, *, repeat: int, ffcv_max_resolution: int, progress: bool) -> dict:
    """Each pipeline of ``plan`` measured ``repeat`` times, in a fresh subprocess each: its best row."""
    from tqdm import tqdm

    def beton(kind: str) -> Path:  # one .beton per FFCV storage, written once and reused
        return Path(os.environ.get("TMPDIR", "/tmp")) / (
            f"stoker-bench-{Path(cfg['images'] or 'x').resolve().name}-R{ffcv_max_resolution}-{FFCV_MODES[kind]}.beton"
        )

    rows: dict[str, dict] = {}
    steps = [(r, k, py) for r in range(repeat) for k, py in plan]
    for _, kind, py in tqdm(steps, desc="bench", unit="run", file=sys.stderr, disable=None if progress else True):
        extra = (
            {"beton": str(beton(kind)), "R": ffcv_max_resolution, "write_mode": FFCV_MODES[kind]}
            if kind in FFCV_MODES
            else {}
        )
        res = _measure(kind, {**cfg, **extra}, py)
        best = rows.get(kind)
        if best is None or "error" in best or res.get("img_s", 0) > best.get("img_s", 0):
            rows[kind] = res
    return rows


def main(args: argparse.Namespace) -> int:
    from stoker.pipeline.storage import parse_storage_options

    result = bench(
        args.data,
        storage_options=parse_storage_options(args.storage_option) or None,
        images=args.images,
        masks=args.masks,
        channels=args.channels,
        batch_size=args.batch_size,
        crop=args.crop,
        epochs=args.epochs,
        seconds=args.seconds,
        warmup=args.warmup,
        workers=args.workers,
        only=args.only.split(","),
        repeat=args.repeat,
        ffcv_python=args.ffcv_python,
        ffcv_max_resolution=args.ffcv_max_resolution,
        pixel_cache=args.pixel_cache,
        progress=True,
    )
    if args.plot:
        result.plot(args.plot)
    print(json.dumps(result.to_dict(), indent=1) if args.json else result.format_table())
    return 0
