"""Benchmark stoker's Loader against the usual ways of feeding a model, side by side.

Each pipeline runs in a fresh subprocess (clean peak RSS and CPU time), with the same
crop, batch size and training augmentation (RandomResizedCrop + flip), for a warm-up
that is not counted and then up to --epochs epochs or --seconds seconds:

  (1) torchvision ImageFolder + PIL + DataLoader(num_workers=cores), float32 normalized
      (only with --images: the original files)
  (2) webdataset + PIL + DataLoader on the shards, uint8
  (3) DALI's own fn.readers.webdataset graph on the shards (buffer shuffle), uint8
  (4) FFCV, when importable (here, or in --ffcv-python), from a .beton of --images
  (5) stoker Loader, once per available backend (nvjpeg: decoded on the GPU, batches on
      the GPU; skipped without CUDA)
  and the decode-only ceiling: every image of the shards decoded once by `cores`
  processes, nothing else.

Columns: images/s, ratio to (1) (or to (2) without --images), CPU % (all processes of
the pipeline; 200% = two cores busy), peak RSS (sum over the pipeline's processes; shared
pages count once per process), bytes per batch handed to the device.

examples:
  stoker bench /data/packed/train --images /data/imagenet/train
  stoker bench out/train --json --seconds 10
  stoker bench out/train --images src --plot bench.png
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from .errors import UsageError

HELP = "side-by-side loader throughput: torchvision, webdataset, DALI reader, FFCV, stoker"

ALL = ("torchvision", "wds", "dali-reader", "ffcv", "stoker-dali", "stoker-pil", "stoker-nvjpeg", "ceiling")
STOKER = ("stoker-dali", "stoker-pil", "stoker-nvjpeg")
LABELS = {
    "torchvision": "(1) torchvision ImageFolder+PIL",
    "wds": "(2) webdataset+PIL",
    "dali-reader": "(3) DALI fn.readers.webdataset",
    "ffcv": "(4) FFCV",
    "stoker-dali": "(5) stoker Loader (dali)",
    "stoker-pil": "(5) stoker Loader (pil)",
    "stoker-nvjpeg": "(5) stoker Loader (nvjpeg, GPU)",
    "stoker-dali-dali-resize": "(5) stoker Loader (dali, fn.resize)",
    "ceiling": "decode-only ceiling",
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("data", metavar="DATA", help="a packed split (or a dataset root with train/)")
    p.add_argument("--images", metavar="SRC", help="the original ImageFolder tree, for (1) and (4)")
    p.add_argument("--batch-size", type=int, default=64, help="default 64")
    p.add_argument("--crop", type=int, default=224, help="default 224")
    p.add_argument("--epochs", type=int, default=3, help="measured epochs per pipeline (default 3)")
    p.add_argument("--seconds", type=float, default=30.0,
                   help="stop a pipeline's measurement after this long (default 30)")
    p.add_argument("--warmup", type=int, default=3, metavar="BATCHES",
                   help="batches run before timing starts (default 3)")
    p.add_argument("--workers", type=int, default=0, help="workers / threads per pipeline (default: cores)")
    p.add_argument("--only", default="", metavar="LIST",
                   help="comma-separated subset of: " + ",".join(ALL) + ",stoker-dali-dali-resize")
    p.add_argument("--repeat", type=int, default=1,
                   help="rounds over all pipelines; each row reports its best round (default 1)")
    p.add_argument("--ffcv-python", metavar="PATH", help="a python with ffcv installed, for column (4)")
    p.add_argument("--ffcv-max-resolution", type=int, default=256, metavar="R",
                   help="FFCV max_resolution when writing its .beton (default 256)")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.add_argument("--plot", metavar="FILE.png", help="also draw a bar chart (needs matplotlib)")


# ---- measurement helpers (run in the child) -------------------------------------------------

def _tree_pids(root: int) -> list[int]:
    pids, todo = [], [root]
    while todo:
        pid = todo.pop()
        pids.append(pid)
        try:
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            pass
    return pids


def _tree_cpu() -> float:
    """CPU seconds (user+system) of this process and its live descendants."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in _tree_pids(os.getpid()):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError):
            pass
    return total


def _tree_peak_rss() -> int:
    """Sum of peak RSS (VmHWM) over this process and its live descendants, bytes."""
    total = 0
    for pid in _tree_pids(os.getpid()):
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


def _timed(batches, cfg: dict) -> dict:
    """Consume an iterator of (images, labels); warm-up excluded; stop at the time limit."""
    warmup, limit = cfg["warmup"], cfg["seconds"]
    n = nbatches = 0
    bytes_per_batch = 0
    t0 = cpu0 = None
    peak = 0
    for k, (images, _labels) in enumerate(batches):
        if k == warmup:
            t0, cpu0 = time.perf_counter(), _tree_cpu()
        elif k > warmup:
            n += len(images)
            nbatches += 1
            bytes_per_batch = max(bytes_per_batch, images.numel() * images.element_size())
            if k % 8 == 0:
                peak = max(peak, _tree_peak_rss())
            if time.perf_counter() - t0 > limit:
                break
    if t0 is None or n == 0:
        raise RuntimeError("not enough batches to measure (lower --warmup or use more data)")
    if getattr(images, "is_cuda", False):  # batches made on the GPU: count only finished work
        import torch

        torch.cuda.synchronize(images.device)
    wall = time.perf_counter() - t0
    cpu = _tree_cpu() - cpu0
    peak = max(peak, _tree_peak_rss())
    return {"images": n, "seconds": wall, "img_s": n / wall, "cpu_pct": 100 * cpu / wall,
            "peak_rss": peak, "bytes_per_batch": bytes_per_batch}


def _epochs(make_epoch, epochs: int):
    for e in range(epochs):
        yield from make_epoch(e)


def _shards(data: str) -> list[str]:
    from stoker.pipeline.manifest import Manifest

    m = Manifest.load(data)
    return [str(Path(data) / s.name) for s in m.shards]


def torchvision_loader(root, *, batch_size: int, crop: int, workers: int, pin_memory: bool = False):
    """The usual torchvision pipeline, column (1) and ``stoker diagnose``'s ImageFolder case:
    ImageFolder + RandomResizedCrop/flip/ToTensor/Normalize + DataLoader, float32 batches.
    Returns ``(loader, dataset)``."""
    import torch
    from torchvision import datasets, transforms

    from stoker.model.normalize import IMAGENET_MEAN, IMAGENET_STD

    tf = transforms.Compose([transforms.RandomResizedCrop(crop), transforms.RandomHorizontalFlip(),
                             transforms.ToTensor(), transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)])
    ds = datasets.ImageFolder(str(root), transform=tf)
    return torch.utils.data.DataLoader(ds, batch_size=batch_size, shuffle=True, num_workers=workers,
                                       drop_last=True, pin_memory=pin_memory, persistent_workers=workers > 0), ds


def _run_torchvision(cfg):
    dl, _ = torchvision_loader(cfg["images"], batch_size=cfg["batch_size"], crop=cfg["crop"], workers=cfg["workers"])
    return _timed(_epochs(lambda e: iter(dl), cfg["epochs"] + 1), cfg)


def _wds_decode(sample):
    import io

    from PIL import Image

    img, cls = sample
    return Image.open(io.BytesIO(img)).convert("RGB"), int(cls)


def _run_wds(cfg):
    import torch
    import webdataset as wds
    from torchvision import transforms

    tf = transforms.Compose([transforms.RandomResizedCrop(cfg["crop"]), transforms.RandomHorizontalFlip(),
                             transforms.PILToTensor()])
    # explicit decoding of the declared keys only (no webdataset auto/pickle decoders)
    tars = _shards(cfg["data"])
    ds = (wds.WebDataset(tars, shardshuffle=len(tars), empty_check=False,
                         workersplitter=wds.split_by_worker)
          .shuffle(1000).to_tuple("jpg;jpeg;png", "cls").map(_wds_decode).map_tuple(tf, lambda c: c)
          .batched(cfg["batch_size"], partial=False))
    dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=cfg["workers"], persistent_workers=True)
    return _timed(_epochs(lambda e: iter(dl), cfg["epochs"] + 1), cfg)


def _run_dali_reader(cfg):
    import torch

    from stoker.pipeline.dali_graph import reader_pipeline
    from stoker.pipeline.manifest import idx_path

    tars = _shards(cfg["data"])
    pipe = reader_pipeline(tars, [str(idx_path(t)) for t in tars], batch_size=cfg["batch_size"],
                           crop=cfg["crop"], threads=cfg["workers"])
    pipe.build()
    per_epoch = max(1, pipe.epoch_size("reader") // cfg["batch_size"])

    def batches():
        for _ in range((cfg["epochs"] + 1) * per_epoch):
            images, labels = pipe.run()
            yield torch.from_dlpack(images.as_tensor()), labels

    return _timed(batches(), cfg)


def _run_stoker(cfg, backend, device="cpu", **kw):
    from stoker.pipeline import Loader

    loader = Loader(cfg["data"], batch_size=cfg["batch_size"], crop=cfg["crop"], backend=backend,
                    threads=cfg["workers"], device=device, **kw)

    def epoch(e):
        loader.set_epoch(e)
        return iter(loader)

    return _timed(_epochs(epoch, cfg["epochs"] + 1), cfg)


def _decode_all(args):
    import io

    from PIL import Image

    from stoker.pipeline.samples import SampleIndex

    data, lo, hi = args
    idx = SampleIndex(data)
    t = time.perf_counter()
    for i in range(lo, hi):
        Image.open(io.BytesIO(idx.image(i))).load()
    return time.perf_counter() - t


def _run_ceiling(cfg):
    """Every image decoded once per epoch by `workers` processes, nothing else."""
    from multiprocessing import get_context

    from stoker.pipeline.samples import SampleIndex

    n = len(SampleIndex(cfg["data"]))
    w = cfg["workers"]
    parts = [(cfg["data"], n * k // w, n * (k + 1) // w) for k in range(w)]
    with get_context("fork").Pool(w) as pool:
        pool.map(_decode_all, [(cfg["data"], lo, min(hi, lo + 20)) for _, lo, hi in parts])  # warm-up
        t0, cpu0, done = time.perf_counter(), _tree_cpu(), 0
        for e in range(10 ** 6):
            pool.map(_decode_all, parts)
            done += n
            elapsed = time.perf_counter() - t0
            # at least `epochs` epochs and 1 s (tiny data), at most `seconds`
            if elapsed > cfg["seconds"] or (e + 1 >= cfg["epochs"] and elapsed > min(1.0, cfg["seconds"])):
                break
        wall, cpu, rss = time.perf_counter() - t0, _tree_cpu() - cpu0, _tree_peak_rss()
    return {"images": done, "seconds": wall, "img_s": done / wall, "cpu_pct": 100 * cpu / wall,
            "peak_rss": rss, "bytes_per_batch": 0}


FFCV_SCRIPT = r"""
import json, os, sys, time
cfg = json.loads(sys.argv[1])
exec(cfg["helpers"])  # the measuring functions of stoker.tools.bench (stoker is not installed there)
import numpy as np, torch
from ffcv.writer import DatasetWriter
from ffcv.fields import RGBImageField, IntField
from ffcv.loader import Loader, OrderOption
from ffcv.fields.decoders import RandomResizedCropRGBImageDecoder, IntDecoder
from ffcv.transforms import RandomHorizontalFlip, ToTensor, ToTorchImage
from torchvision.datasets import ImageFolder
beton = cfg["beton"]
if not os.path.exists(beton):
    ds = ImageFolder(cfg["images"])
    w = DatasetWriter(beton + ".tmp", {"image": RGBImageField(write_mode="jpg", max_resolution=cfg["R"],
                      jpeg_quality=90), "label": IntField()}, num_workers=cfg["workers"])
    w.from_indexed_dataset(ds)
    os.replace(beton + ".tmp", beton)
c = cfg["crop"]
loader = Loader(beton, batch_size=cfg["batch_size"], num_workers=cfg["workers"], order=OrderOption.RANDOM,
                drop_last=True, pipelines={"image": [RandomResizedCropRGBImageDecoder((c, c)), RandomHorizontalFlip(),
                ToTensor(), ToTorchImage()], "label": [IntDecoder(), ToTensor()]})
print("RESULT " + json.dumps(_timed(_epochs(lambda e: iter(loader), cfg["epochs"] + 1), cfg)))
"""


def _child() -> None:
    """Entry point of one measurement subprocess: prints ``RESULT {json}``."""
    cfg = json.loads(sys.argv[1])
    kind = cfg["kind"]
    runners = {
        "torchvision": _run_torchvision, "wds": _run_wds, "dali-reader": _run_dali_reader,
        "stoker-dali": lambda c: _run_stoker(c, "dali"), "stoker-pil": lambda c: _run_stoker(c, "pil"),
        "stoker-nvjpeg": lambda c: _run_stoker(c, "nvjpeg", device="cuda"),
        "stoker-dali-dali-resize": lambda c: _run_stoker(c, "dali", cpu_resize="dali"),
        "ceiling": _run_ceiling,
    }
    print("RESULT " + json.dumps(runners[kind](cfg)), flush=True)


# ---- parent ---------------------------------------------------------------------------------

def _measure(kind: str, cfg: dict, python: str = sys.executable) -> dict:
    cfg = {**cfg, "kind": kind}
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if kind == "ffcv":
        import inspect

        cfg["helpers"] = "\n".join(inspect.getsource(f) for f in (_tree_pids, _tree_cpu, _tree_peak_rss, _timed, _epochs))
        cmd = [python, "-c", FFCV_SCRIPT, json.dumps(cfg)]
    else:
        cmd = [python, "-c", "from stoker.tools.bench import _child; _child()", json.dumps(cfg)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    return {"error": tail[:200]}


def _ffcv_python(args) -> str | None:
    cands = [args.ffcv_python] if args.ffcv_python else [sys.executable]
    for py in cands:
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


def run_bench(args) -> dict:
    from stoker.pipeline.deps import HAS_DALI, has_cuda, usable_cores
    from stoker.pipeline.manifest import MANIFEST_NAME

    data = Path(args.data)
    if not (data / MANIFEST_NAME).exists() and (data / "train" / MANIFEST_NAME).exists():
        data = data / "train"
    if not (data / MANIFEST_NAME).exists():
        raise UsageError(f"{args.data} has no {MANIFEST_NAME} (pack it with `stoker pack`)")
    if args.images and not Path(args.images).is_dir():
        raise UsageError(f"--images {args.images} is not a directory")
    for name in ("batch_size", "crop", "epochs", "repeat"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1")
    only = [k for k in args.only.split(",") if k] or list(ALL)
    unknown = set(only) - set(LABELS)
    if unknown:
        raise UsageError(f"--only: unknown pipeline(s) {sorted(unknown)}; choose from {', '.join(LABELS)}")
    cores = args.workers or usable_cores()
    cfg = {"data": str(data), "images": args.images, "batch_size": args.batch_size, "crop": args.crop,
           "epochs": args.epochs, "seconds": args.seconds, "warmup": args.warmup, "workers": cores}
    notes = []
    plan = []
    for kind in only:
        if kind == "torchvision" and not args.images:
            notes.append("(1) torchvision: skipped (give --images SRC, the original ImageFolder)")
        elif kind in ("dali-reader", "stoker-dali", "stoker-dali-dali-resize") and not HAS_DALI:
            notes.append(f"{LABELS[kind]}: skipped (nvidia-dali not installed)")
        elif kind == "stoker-nvjpeg" and not has_cuda():
            notes.append(f"{LABELS[kind]}: skipped (torch sees no CUDA device; it decodes on the GPU)")
        elif kind == "ffcv":
            py = _ffcv_python(args) if args.images else None
            if not args.images:
                notes.append("(4) FFCV: skipped (needs --images to write its .beton)")
            elif py is None:
                notes.append("(4) FFCV: not installed (pip install ffcv needs libopencv-dev and "
                             "libturbojpeg0-dev; or point --ffcv-python at a python that has it)")
            else:
                plan.append((kind, py))
        else:
            plan.append((kind, sys.executable))
    beton = Path(os.environ.get("TMPDIR", "/tmp")) / (
        f"stoker-bench-{Path(args.images or 'x').resolve().name}-R{args.ffcv_max_resolution}.beton")
    rows: dict[str, dict] = {}
    from tqdm import tqdm

    steps = [(r, k, py) for r in range(args.repeat) for k, py in plan]
    for _, kind, py in tqdm(steps, desc="bench", unit="run", file=sys.stderr, disable=None):
        extra = {"beton": str(beton), "R": args.ffcv_max_resolution} if kind == "ffcv" else {}
        res = _measure(kind, {**cfg, **extra}, py)
        best = rows.get(kind)
        if best is None or "error" in best or res.get("img_s", 0) > best.get("img_s", 0):
            rows[kind] = res
    base_kind = "torchvision" if "img_s" in rows.get("torchvision", {}) else (
        "wds" if "img_s" in rows.get("wds", {}) else None)
    base = rows[base_kind]["img_s"] if base_kind else None
    out_rows = []
    for kind, _ in plan:
        r = rows[kind]
        row = {"pipeline": kind, "label": LABELS[kind], **r}
        if base and "img_s" in r:
            row["ratio"] = r["img_s"] / base
        out_rows.append(row)
    summary = {}
    best_stoker = max((rows[k]["img_s"] for k in STOKER if "img_s" in rows.get(k, {})),
                      default=None)
    if best_stoker:
        for k, name in (("torchvision", "vs_torchvision"), ("dali-reader", "vs_dali_reader"),
                        ("ceiling", "of_ceiling"), ("ffcv", "vs_ffcv")):
            if "img_s" in rows.get(k, {}):
                summary[name] = best_stoker / rows[k]["img_s"]
    return {"data": str(data), "images": args.images, "batch_size": args.batch_size, "crop": args.crop,
            "workers": cores, "epochs": args.epochs, "seconds_limit": args.seconds, "baseline": base_kind,
            "rows": out_rows, "summary": summary, "notes": notes}


def format_table(result: dict) -> str:
    base = result["baseline"]
    lines = [f"stoker bench {result['data']}: batch {result['batch_size']}, crop {result['crop']}, "
             f"{result['workers']} workers/threads, device cpu"
             + (" (nvjpeg: cuda)" if any(r["pipeline"] == "stoker-nvjpeg" for r in result["rows"]) else ""),
             f"{'pipeline':<38} {'img/s':>8} {'vs ' + ('(1)' if base == 'torchvision' else '(2)'):>7} "
             f"{'CPU %':>6} {'peak RSS':>9} {'bytes/batch':>12}"]
    for r in result["rows"]:
        if "error" in r:
            lines.append(f"{r['label']:<38} failed: {r['error']}")
            continue
        ratio = f"{r['ratio']:.2f}x" if "ratio" in r else "-"
        bpb = _fmt_bytes(r["bytes_per_batch"]) if r["bytes_per_batch"] else "-"
        lines.append(f"{r['label']:<38} {r['img_s']:>8.0f} {ratio:>7} {r['cpu_pct']:>5.0f}% "
                     f"{_fmt_bytes(r['peak_rss']):>9} {bpb:>12}")
    s = result["summary"]
    if s:
        parts = {"vs_torchvision": "x torchvision", "vs_dali_reader": "x DALI reader", "vs_ffcv": "x FFCV"}
        text = [f"{s[k]:.2f}{v}" for k, v in parts.items() if k in s]
        if "of_ceiling" in s:
            text.append(f"{100 * s['of_ceiling']:.0f}% of the decode-only ceiling")
        lines.append("best stoker Loader: " + ", ".join(text))
    lines += result["notes"]
    return "\n".join(lines)


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result["rows"] if "img_s" in r]
    fig, ax = plt.subplots(figsize=(8, 0.5 * len(rows) + 1.5))
    colors = ["tab:orange" if r["pipeline"].startswith("stoker") else
              "tab:gray" if r["pipeline"] == "ceiling" else "tab:blue" for r in rows]
    ax.barh([r["label"] for r in rows][::-1], [r["img_s"] for r in rows][::-1], color=colors[::-1])
    for k, r in enumerate(rows[::-1]):
        ax.text(r["img_s"], k, f" {r['img_s']:.0f}", va="center")
    ax.set_xlabel("images / s")
    ax.set_title(f"batch {result['batch_size']}, crop {result['crop']}, {result['workers']} cores, cpu")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(args) -> int:
    result = run_bench(args)
    if args.plot:
        plot(result, args.plot)
    print(json.dumps(result, indent=1) if args.json else format_table(result))
    return 0
