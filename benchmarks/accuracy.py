"""Time to accuracy: the same network trained to the same val accuracy at a fixed crop or with
progressive resizing, from JPEG or from the decoded-pixel tier, and the wall time each needs.

``python -m stoker.benchmarks.accuracy [DATA]`` trains four runs of ``stoker train`` (same
seed, network, epochs, batch and learning-rate schedule): fixed ``--crop``; ``--progressive``
(FFCV's ramp, the val crop staying ``--crop``); each again with ``--pixel-cache`` (a fresh store
per run, so its filling epoch is in the time). The target is the accuracy every run reaches
(the lowest of their best val top-1, unless ``--target`` says), and each run's time to it is the
wall time from its start to the end of the first epoch whose val top-1 reaches it. DATA is a
packed dataset root (``train/`` and ``val/``); without it, ``stoker demo``'s procedural
dataset (generated and packed once into the cache).

examples:
  python -m stoker.benchmarks.accuracy --epochs 8 --crop 64 --progressive 32:64
  python -m stoker.benchmarks.accuracy /data/imagenet-shards --crop 224 --progressive 160:192:11-13 --epochs 16
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from stoker.errors import CheckFailedError, StokerError, UsageError
from stoker.tools.common.results import Result

#: the runs: (name, progressive, pixel tier)
VARIANTS = (
    ("fixed crop, JPEG", False, False),
    ("progressive, JPEG", True, False),
    ("fixed crop, pixel tier", False, True),
    ("progressive, pixel tier", True, True),
)


@dataclasses.dataclass
class AccuracyResult(Result):
    """What :func:`time_to_accuracy` measured; :meth:`to_dict` is the ``--json`` output.

    Attributes:
        data: The dataset root trained on.
        target: The val top-1 every run was timed to.
        settings: Epochs, batch size, crop, the progressive ramp, the network, the device.
        rows: One per run: ``name``, ``seconds_to_target`` (None: never reached), ``epoch_reached``
            (1-based), ``best_top1``, ``seconds`` (the whole process), ``images_per_s``, ``data_wait``,
            ``per_epoch`` (``[epoch, seconds since the process started, val top-1]``), ``run``.
    """

    data: str
    target: float
    settings: dict
    rows: list

    def format_table(self) -> str:
        """The human table."""
        s = self.settings
        lines = [
            f"time to {100 * self.target:.1f}% val top-1: {s['arch']}, {s['epochs']} epochs, "
            f"batch {s['batch_size']}, crop {s['crop']} (progressive {s['progressive']}), {s['device']}",
            f"{'run':<26} {'to target':>10} {'epoch':>6} {'best top-1':>11} {'whole run':>10} {'img/s':>7} {'wait':>6}",
        ]
        for r in self.rows:
            reached = "-" if r["seconds_to_target"] is None else f"{r['seconds_to_target']:.1f} s"
            lines.append(
                f"{r['name']:<26} {reached:>10} {r['epoch_reached'] or '-':>6} {100 * r['best_top1']:>10.1f}% "
                f"{r['seconds']:>8.1f} s {r['images_per_s'] or 0:>7.0f} {100 * (r['data_wait'] or 0):>5.0f}%"
            )
        first = self.rows[0] if self.rows else None
        for r in self.rows[1:]:
            if first["seconds_to_target"] and r["seconds_to_target"]:
                speedup = first["seconds_to_target"] / r["seconds_to_target"]
                lines.append(f"{r['name']}: {speedup:.2f}x as fast to the target as {first['name']}")
        return "\n".join(lines)


def time_to_accuracy(
    data: str | Path | None = None,
    *,
    cache: str | Path | None = None,
    target: float | None = None,
    epochs: int = 6,
    crop: int = 64,
    progressive: str = "32:64",
    batch_size: int = 64,
    per_class: int = 200,
    arch: str = "inception",
    lr: float | None = 0.05,
    device: str = "auto",
    threads: int | None = None,
    variants=VARIANTS,
    say: Callable[[str], None] | None = None,
) -> AccuracyResult:
    """Train each of ``variants`` on ``data`` and time it to ``target`` val top-1.

    Args:
        data: A packed dataset root with ``train/`` and ``val/`` (None: the demo's, in ``cache``).
        cache: Where the demo's dataset, the runs and the pixel stores go (None: the demo's cache).
        target: Val top-1 to time the runs to (None: the lowest best top-1 of the runs).
        epochs, crop, batch_size, arch, lr, device, threads: ``stoker train``'s, the same in every run.
        progressive: The progressive runs' ``--progressive`` (the val crop stays ``crop``).
        per_class: The demo dataset's training images per class.
        variants: ``(name, progressive, pixel tier)`` of each run.
        say: Called with a line as each run starts.

    Returns:
        The :class:`AccuracyResult`.

    Raises:
        UsageError: ``data`` without ``train/`` and ``val/``, or a bad setting.
        CheckFailedError: a run failed (its last line).
    """
    from stoker.tools.demo import _prepare_classify, default_cache

    say = say or (lambda line: None)
    cache = Path(cache or default_cache()).expanduser()
    cache.mkdir(parents=True, exist_ok=True)
    if data is None:
        data = _prepare_classify(cache, per_class, say)["shards"]
    data = Path(data)
    if not ((data / "train").is_dir() and (data / "val").is_dir()):
        raise UsageError(f"{data} must hold train/ and val/ (a `stoker pack` OUT with a val split)")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    common = ["--arch", arch, "--epochs", str(epochs), "--batch-size", str(batch_size), "--crop", str(crop)]
    common += ["--device", device, "--seed", "0", "--log-every", "10", "--no-progress", "--json"]
    common += ["--warmup-epochs", str(min(1.0, epochs / 4))] + (["--lr", str(lr)] if lr else [])
    common += ["--threads", str(threads)] if threads is not None else []
    rows = []
    for k, (name, ramp, pixels) in enumerate(variants):
        say(f"[{k + 1}/{len(variants)}] {name}")
        out = cache / "runs" / f"accuracy-{stamp}-{k}"
        store = cache / f"pixels-{stamp}-{k}"
        argv = [
            *common,
            *(["--progressive", progressive] if ramp else []),
            *(["--pixel-cache", str(store)] if pixels else []),
        ]
        t0 = time.time()
        try:  # a process of its own: every run pays the same start-up
            proc = subprocess.run(
                [sys.executable, "-m", "stoker", "train", str(data), "--out", str(out), *argv],
                capture_output=True,
                text=True,
                env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")},
            )
        finally:
            shutil.rmtree(store, ignore_errors=True)
        if proc.returncode:
            tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise CheckFailedError(f"the run {name!r} failed: {tail}")
        summary = json.loads(proc.stdout[proc.stdout.index("{") :])
        rows_out = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
        per_epoch = [[v["epoch"] + 1, v["time"] - t0, v["top1"]] for v in rows_out if v.get("kind") == "val"]
        rows.append(
            {
                "name": name,
                "per_epoch": per_epoch,
                "best_top1": max(t for _, _, t in per_epoch),
                "seconds": time.time() - t0,
                "images_per_s": summary["images_per_s"],
                "data_wait": summary["data_wait"],
                "run": str(out),
            }
        )
    target = min(r["best_top1"] for r in rows) if target is None else float(target)
    for r in rows:
        first = next(((e, s) for e, s, t in r["per_epoch"] if t >= target), (None, None))
        r["epoch_reached"], r["seconds_to_target"] = first
    settings = {
        "epochs": epochs,
        "batch_size": batch_size,
        "crop": crop,
        "progressive": progressive,
        "arch": arch,
        "device": summary["device"],
        "amp": summary["amp"],
    }
    return AccuracyResult(data=str(data), target=target, settings=settings, rows=rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m stoker.benchmarks.accuracy", description=__doc__.split("\n\n")[0])
    p.add_argument("data", nargs="?", help="a packed dataset root with train/ and val/ (default: the demo's)")
    p.add_argument("--cache", default=None, help="where the demo dataset, runs and pixel stores go")
    p.add_argument("--target", type=float, default=None, help="val top-1 to reach (default: what every run reaches)")
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--crop", type=int, default=64)
    p.add_argument("--progressive", default="32:64", help="the progressive runs' START:END[:EPOCHS] (default 32:64)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--per-class", type=int, default=200, help="the demo dataset's images per class")
    p.add_argument("--arch", default="inception")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    try:
        result = _run(args)
    except StokerError as e:  # one line, as the stoker command prints it
        print(f"stoker bench accuracy: {e}", file=sys.stderr)
        return e.exit_code
    print(json.dumps(result.to_dict(), indent=1) if args.json else result.format_table())
    return 0


def _run(args: argparse.Namespace) -> AccuracyResult:
    return time_to_accuracy(
        args.data,
        cache=args.cache,
        target=args.target,
        epochs=args.epochs,
        crop=args.crop,
        progressive=args.progressive,
        batch_size=args.batch_size,
        per_class=args.per_class,
        arch=args.arch,
        lr=args.lr,
        device=args.device,
        threads=args.threads,
        say=lambda line: print(line, file=sys.stderr, flush=True),
    )


__all__ = ["VARIANTS", "AccuracyResult", "main", "time_to_accuracy"]

if __name__ == "__main__":
    sys.exit(main())
