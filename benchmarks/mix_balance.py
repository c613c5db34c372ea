"""Mixes and balance, exact or in expectation: per-class deviation from its share over a long tail,
what the mixed order costs a batch, and a balanced run's time to balanced accuracy.

Deviation: a 100-class long tail (``--imbalance`` 100:1, the largest class ``--largest``
samples) balanced over ``--epochs`` epochs on ``--world`` simulated ranks (each rank's order built
as that rank builds it; no processes). Per epoch, each class's draws over all ranks against its
share (``L / 100``). Compared: stoker (``balance="classes"``: per-class quotas by largest
remainder), ``WeightedRandomSampler`` + ``DistributedSampler`` hand-rolled the usual way (every
rank draws the same ``torch.multinomial`` with a ``(seed, epoch)`` generator, then takes its
``rank::world`` slice), and torchdata's ``MultiNodeWeightedSampler`` (one source node per class,
equal weights, one sampler per rank) when torchdata is installed.

Overhead: ``Loader`` batches per second on one split against a 2-split mix (0.7/0.3) and a
balanced split of the same samples (tiny 24x20 JPEGs, ``backend="pil"``, in-process: the order's
share of a batch is as large as it gets), and the order alone (one batch of positions).

Accuracy (``--accuracy``): ``stoker train`` on a generated long-tail split (6 classes, 100:1) with
and without ``--balance classes``, the same steps; val is balanced, and each epoch's balanced
top-1 (the mean per-class recall) is read from ``metrics.jsonl``.

    python -m stoker.benchmarks.mix_balance
    python -m stoker.benchmarks.mix_balance --accuracy --json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HELP = "per-class deviation of stoker's balance vs weighted samplers; the mixed order's cost; balanced time to accuracy"


def long_tail(classes: int, largest: int, imbalance: float) -> np.ndarray:
    """Samples per class: ``largest`` down to ``largest / imbalance``, geometrically."""
    return np.maximum(1, np.round(largest * imbalance ** (-np.arange(classes) / (classes - 1)))).astype(np.int64)


def _deviation(counts: np.ndarray, length: int) -> float:
    """The worst class's relative deviation from its share (``length / classes``)."""
    share = length / counts.shape[-1]
    return float(np.abs(counts - share).max() / share)


def stoker_counts(sizes: np.ndarray, length: int, epochs: int, world: int, seed: int = 0) -> np.ndarray:
    """``[epochs, classes]`` draws of stoker's balanced order, ranks simulated one by one."""
    from stoker.pipeline.balance_tables import ClassSlots
    from stoker.pipeline.order.mix import MixOrder, MixPlan

    labels = np.repeat(np.arange(len(sizes)), sizes)
    slots = ClassSlots(np.concatenate([[0], np.cumsum(sizes)]), np.arange(len(labels)))  # sorted already
    plan = MixPlan([len(labels)], [1.0], length=length, class_counts=[sizes], class_weights=[None])
    orders = [
        MixOrder(plan, [slots], [0], rank=r, world_size=world, train=True, batch_size=1, drop_last=True)
        for r in range(world)
    ]
    out = np.zeros((epochs, len(sizes)), np.int64)
    for e in range(epochs):
        for o in orders:
            out[e] += np.bincount(labels[o.positions(seed, e)], minlength=len(sizes))
    return out


def weighted_sampler_counts(sizes: np.ndarray, length: int, epochs: int, world: int, seed: int = 0) -> np.ndarray:
    """The hand-rolled distributed weighted sampler: per epoch one ``WeightedRandomSampler`` draw of
    ``length`` (weights 1 / class size, a ``(seed, epoch)`` generator, the same on every rank), each
    rank its ``DistributedSampler``-style ``rank::world`` slice of it."""
    import torch
    from torch.utils.data import WeightedRandomSampler

    labels = np.repeat(np.arange(len(sizes)), sizes)
    weights = torch.as_tensor(1.0 / sizes[labels], dtype=torch.double)
    out = np.zeros((epochs, len(sizes)), np.int64)
    per_rank = length // world
    for e in range(epochs):
        g = torch.Generator().manual_seed(seed * 100_003 + e)
        drawn = np.fromiter(WeightedRandomSampler(weights, length, replacement=True, generator=g), np.int64, length)
        for r in range(world):
            out[e] += np.bincount(labels[drawn[r::world][:per_rank]], minlength=len(sizes))
    return out


def torchdata_counts(sizes: np.ndarray, length: int, epochs: int, world: int, seed: int = 0) -> np.ndarray | None:
    """torchdata's ``MultiNodeWeightedSampler`` over one node per class (equal weights, cycled),
    one sampler per rank (its ``rank``/``world_size``), ``length / world`` items a rank an epoch;
    ``None`` when torchdata is not installed."""
    try:
        from torchdata.nodes import IterableWrapper, MultiNodeWeightedSampler
    except ImportError:
        return None
    out = np.zeros((epochs, len(sizes)), np.int64)
    per_rank = length // world
    for r in range(world):
        nodes = {str(c): IterableWrapper([c] * int(n)) for c, n in enumerate(sizes)}  # each item: its class
        sampler = MultiNodeWeightedSampler(
            nodes,
            {str(c): 1.0 for c in range(len(sizes))},
            stop_criteria="CYCLE_FOREVER",
            rank=r,
            world_size=world,
            seed=seed,
        )
        it = iter(sampler)
        for e in range(epochs):
            for _ in range(per_rank):
                out[e, next(it)] += 1
    return out


def deviation(args: argparse.Namespace) -> dict:
    sizes = long_tail(args.classes, args.largest, args.imbalance)
    step = math.lcm(args.world * args.batch, args.classes)  # whole global batches, whole per-class shares
    if step > sizes.sum():
        step = args.world * args.batch
    length = int(sizes.sum()) // step * step
    rows = {}
    for name, fn in (
        ("stoker balance='classes'", stoker_counts),
        ("WeightedRandomSampler + DistributedSampler", weighted_sampler_counts),
        ("torchdata MultiNodeWeightedSampler", torchdata_counts),
    ):
        t0 = time.perf_counter()
        counts = fn(sizes, length, args.epochs, args.world)
        if counts is None:
            rows[name] = None
            continue
        per_epoch = [_deviation(c, length) for c in counts]
        rows[name] = {
            "worst_epoch_deviation": max(per_epoch),
            "median_epoch_deviation": statistics.median(per_epoch),
            "deviation_over_all_epochs": _deviation(counts.sum(0), length * args.epochs),
            "worst_class_samples_off": float(np.abs(counts - length / args.classes).max()),
            "seconds": time.perf_counter() - t0,
        }
    return {
        "samples": int(sizes.sum()),
        "epoch_length": length,
        "class_sizes": [int(sizes[0]), int(sizes[-1])],
        "rows": rows,
    }


def overhead(args: argparse.Namespace) -> dict:
    """Loader batches per second: one split, a 2-split mix, a balanced split (same settings)."""
    import warnings

    from stoker.benchmarks.scale import build_split
    from stoker.pipeline import Loader

    warnings.simplefilter("ignore")
    root = Path(args.dir)
    root.mkdir(parents=True, exist_ok=True)
    big, _ = build_split(root, args.overhead_samples, 1000)
    small, _ = build_split(root, max(1000, args.overhead_samples // 10 // 1000 * 1000), 1000)
    kw = dict(batch_size=args.overhead_batch, crop=16, backend="pil", threads=0, seed=0)
    variants = {
        "one split": (big, {}),
        "2-split mix 0.7/0.3": ([big, small], {"weights": [0.7, 0.3], "epoch_length": args.overhead_samples}),
        "balance='classes'": (big, {"balance": "classes"}),
    }
    loaders = {name: Loader(path, **kw, **extra) for name, (path, extra) in variants.items()}
    rows: dict = {name: {"batch_ms": [], "order_ms": []} for name in variants}
    for _ in range(args.repeat):  # interleaved: the shared machine's load hits each alike
        for name, loader in loaders.items():
            it = iter(loader)
            next(it)  # warm
            t0 = time.perf_counter()
            for _ in range(args.batches):
                next(it)
            rows[name]["batch_ms"].append((time.perf_counter() - t0) / args.batches * 1e3)
            it.close()
            o = loader.order
            batches = o.batches(0, 0, 0, 0, o.stop(0), lambda p: p)  # the Loader's own path to its positions
            t0 = time.perf_counter()
            for k in range(min(args.batches, len(batches))):
                batches[k]
            rows[name]["order_ms"].append((time.perf_counter() - t0) / min(args.batches, len(batches)) * 1e3)
    base = statistics.median(rows["one split"]["batch_ms"])
    for r in rows.values():
        r["batch_ms_median"] = statistics.median(r["batch_ms"])
        r["batch_ms_min"] = min(r["batch_ms"])
        r["order_ms_median"] = statistics.median(r["order_ms"])
        r["vs_one_split"] = r["batch_ms_median"] / base - 1
    for loader in loaders.values():
        loader.close()
    return {"samples": args.overhead_samples, "batch": args.overhead_batch, "rows": rows}


def order_alone(args: argparse.Namespace) -> dict:
    """The order alone at scale: one rank of ``--world`` over ``--order-samples`` samples, the plain
    order against a 2-split mix (0.9/0.1 of the samples at 0.7/0.3): the rank's whole epoch, and a
    batch of ``--overhead-batch`` as the Loader takes it (its epoch batches). Interleaved rounds."""
    from stoker.pipeline.order.global_order import GlobalOrder
    from stoker.pipeline.order.mix import MixOrder, MixPlan

    n, w, bs = args.order_samples, args.world, args.overhead_batch
    a = n * 9 // 10
    plan = MixPlan([a, n - a], [0.7, 0.3], length=n, class_counts=[None, None], class_weights=[None, None])
    orders = {
        "plain": GlobalOrder([n], rank=0, world_size=w, train=True, batch_size=bs, drop_last=True),
        "2-split mix 0.7/0.3": MixOrder(
            plan, [None, None], [0, a], rank=0, world_size=w, train=True, batch_size=bs, drop_last=True
        ),
    }
    rows: dict = {name: {"epoch_ms": [], "batch_ms": []} for name in orders}
    for r in range(args.repeat):
        for name, o in orders.items():
            t0 = time.perf_counter()
            o.positions(0, r)
            rows[name]["epoch_ms"].append((time.perf_counter() - t0) * 1e3)
            batches = o.batches(0, r, 0, 0, o.stop(0), lambda p: p)
            k = min(len(batches), 10 * args.batches)
            t0 = time.perf_counter()
            for i in range(k):
                batches[i]
            rows[name]["batch_ms"].append((time.perf_counter() - t0) / k * 1e3)
    for r in rows.values():
        r["epoch_ms_median"], r["batch_ms_median"] = statistics.median(r["epoch_ms"]), statistics.median(r["batch_ms"])
    return {"samples": n, "world": w, "share": orders["plain"].share(), "batch": bs, "rows": rows}


def accuracy(args: argparse.Namespace) -> dict:
    """``stoker train`` on a generated 6-class long tail (100:1), balanced vs plain, the same steps."""
    import subprocess

    root = Path(args.dir) / "longtail"
    if not (root / "train" / "stoker.json").exists():
        _write_long_tail(root, args)
    rows = {}
    for name, flags in (("plain", []), ("balance classes", ["--balance", "classes"])):
        run = Path(args.dir) / f"run-{name.replace(' ', '-')}"
        cmd = [sys.executable, "-m", "stoker", "train", str(root), "--out", str(run), "--overwrite"]
        cmd += ["--epochs", str(args.accuracy_epochs), "--batch-size", "32", "--crop", "32", "--no-progress", "--json"]
        cmd += ["--threads", "1", "--seed", "0", *flags]
        t0, start = time.perf_counter(), time.time()
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        if proc.returncode != 0:
            raise SystemExit(f"{name}: stoker train failed: {proc.stderr.strip()[-2000:]}")
        seconds = time.perf_counter() - t0
        val = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if '"val"' in x]
        rows[name] = {
            "seconds": seconds,
            "per_epoch": [[v["epoch"] + 1, round(v["time"] - start, 1), round(v["balanced_top1"], 4)] for v in val],
            "best_balanced_top1": max(v["balanced_top1"] for v in val),
            "steps": json.loads(proc.stdout)["steps"],
        }
    target = min(r["best_balanced_top1"] for r in rows.values())  # what every run reaches
    for r in rows.values():
        r["seconds_to_target"] = next(t for _, t, acc in r["per_epoch"] if acc >= target)
    return {"classes": 6, "imbalance": 100, "target_balanced_top1": target, "rows": rows}


def _write_long_tail(root: Path, args: argparse.Namespace) -> None:
    """``stoker demo``'s procedural images: train a 100:1 tail over 6 classes, val balanced."""
    import random

    from stoker.pipeline.shards.manifest import Manifest
    from stoker.pipeline.shards.writer import ShardWriter
    from stoker.tools.common.synth import CLASSES, draw, encode

    rng = random.Random(0)
    train_sizes = long_tail(len(CLASSES), args.accuracy_largest, 100.0)
    for split, sizes in (("train", train_sizes), ("val", [args.accuracy_val] * len(CLASSES))):
        labels = [c for c, n in enumerate(sizes) for _ in range(int(n))]
        rng.shuffle(labels)
        (root / split).mkdir(parents=True, exist_ok=True)
        with ShardWriter(root / split / "shard-000000.tar") as w:
            for i, c in enumerate(labels):
                size = (rng.randint(40, 64), rng.randint(40, 64))
                w.write(f"{i:09d}", {"jpg": encode(draw(CLASSES[c], size, rng), quality=90), "cls": str(c).encode()})
        Manifest(num_samples=len(labels), classes=list(CLASSES), shards=[w.info], pack={}).save(root / split)


def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m stoker.benchmarks.mix_balance", description=__doc__.split("\n\n")[0])
    p.add_argument("--classes", type=int, default=100)
    p.add_argument("--largest", type=int, default=1000, help="samples of the largest class (default 1000)")
    p.add_argument("--imbalance", type=float, default=100.0, help="largest / smallest class (default 100)")
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--world", type=int, default=8, help="simulated ranks (default 8)")
    p.add_argument("--batch", type=int, default=32, help="per-rank batch: epochs of whole global batches (default 32)")
    p.add_argument("--overhead-batch", type=int, default=256, help="the overhead's batch (default 256)")
    p.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "stoker-mix-bench"))
    p.add_argument("--overhead-samples", type=int, default=20_000, help="samples of the overhead's split")
    p.add_argument("--batches", type=int, default=20, help="batches timed per round (default 20)")
    p.add_argument("--repeat", type=int, default=5, help="rounds of the overhead (median reported)")
    p.add_argument("--order-samples", type=int, default=1_000_000, help="samples of the order-alone rows")
    p.add_argument("--no-overhead", dest="overhead", action="store_false", help="skip the Loader overhead")
    p.add_argument("--accuracy", action="store_true", help="also the balanced vs plain time-to-accuracy runs")
    p.add_argument("--accuracy-epochs", type=int, default=8)
    p.add_argument("--accuracy-largest", type=int, default=600, help="train samples of the largest class")
    p.add_argument("--accuracy-val", type=int, default=60, help="val samples per class")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    return p


def _print(result: dict) -> None:
    d = result["deviation"]
    st = result["settings"]
    print(
        f"{st['classes']} classes of {d['class_sizes'][0]:,} down to {d['class_sizes'][1]:,} samples "
        f"({d['samples']:,}), epochs of {d['epoch_length']:,}, {st['world']} ranks, {st['epochs']} epochs"
    )
    print("| sampler | worst class, worst epoch | median epoch | all epochs together | worst class, samples off |")
    print("|---|---|---|---|---|")
    for name, r in d["rows"].items():
        if r is None:
            print(f"| {name} | not installed | | | |")
            continue
        print(
            f"| {name} | {100 * r['worst_epoch_deviation']:.2f}% | {100 * r['median_epoch_deviation']:.2f}% | "
            f"{100 * r['deviation_over_all_epochs']:.2f}% | {r['worst_class_samples_off']:.1f} |"
        )
    if "overhead" in result:
        o = result["overhead"]
        print(f"\nLoader, {o['samples']:,} samples, batch {o['batch']} (median of rounds)")
        print("| order | ms a batch | vs one split | order alone, ms a batch |")
        print("|---|---|---|---|")
        for name, r in o["rows"].items():
            print(
                f"| {name} | {r['batch_ms_median']:.2f} | {100 * r['vs_one_split']:+.1f}% | "
                f"{r['order_ms_median']:.3f} |"
            )
    if "order" in result:
        o = result["order"]
        print(f"\nthe order alone: {o['samples']:,} samples, rank 0 of {o['world']} ({o['share']:,} a rank), median")
        print(f"| order | the rank's epoch, ms | a batch of {o['batch']} as the Loader takes it, ms |")
        print("|---|---|---|")
        for name, r in o["rows"].items():
            print(f"| {name} | {r['epoch_ms_median']:.1f} | {r['batch_ms_median']:.3f} |")
    if "accuracy" in result:
        a = result["accuracy"]
        print(f"\ntarget: balanced top-1 {100 * a['target_balanced_top1']:.1f}% (the lowest best of the runs)")
        print("| run | steps | seconds | to target, s | best balanced top-1 | per epoch (epoch, s, balanced top-1) |")
        print("|---|---|---|---|---|---|")
        for name, r in a["rows"].items():
            print(
                f"| {name} | {r['steps']} | {r['seconds']:.0f} | {r['seconds_to_target']:.0f} | "
                f"{100 * r['best_balanced_top1']:.1f}% | {r['per_epoch']} |"
            )


def main(argv: list[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    result: dict = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()}",
        "settings": {"classes": args.classes, "world": args.world, "epochs": args.epochs},
        "deviation": deviation(args),
    }
    if args.overhead:
        result["overhead"] = overhead(args)
        result["order"] = order_alone(args)
    if args.accuracy:
        result["accuracy"] = accuracy(args)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        _print(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
