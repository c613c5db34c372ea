"""A billion samples, simulated: what one rank pays at Loader start-up, epoch start and
resume, at several split sizes and world sizes, ranks simulated one after another.

    python -m stoker.benchmarks.scale --samples 1000000,10000000 --worlds 1,8,64,512
    python -m stoker.benchmarks.scale --samples 1000000,10000000 --worlds 64,512 --mix --balance

``--mix`` reads a 2-split mix (the split and one a tenth its size, weights 0.7/0.3: ``Loader([a,
b], weights=...)``); ``--balance`` balances the classes (``balance="classes"``; the class
members file is built once per split before the ranks, timed like the table).

The splits are built cheaply: one shard of ``--samples-per-shard`` tiny JPEGs is written once
and hard-linked as many times as the split needs (the shards' bytes are shared, their names
and the manifest are a real split's; the sample table, ``stoker.index``, is built from the
``.idx`` files as ``stoker index`` builds it, and that build is timed too). Each rank is measured
in a fresh process (so its memory is its own):

* construction: ``Loader(split, rank=r, world_size=W, ...)``, seconds and RSS increase;
* epoch start: ``set_epoch(1)`` to the first batch in hand (the rank's order evaluated, one
  batch of ``--batch-size`` decoded);
* resume: ``load_state_dict`` of a state halfway through epoch 1 (saved by the same rank) to
  the first batch in hand, on a fresh Loader.

Times are the minimum and median of ``--repeat`` runs; the memory is the largest increase of
the process's anonymous memory (what it holds: construction, then at the end with two Loaders
and an epoch's order; the decode path's modules are imported before the baseline), with the
file pages it mapped (shard and table pages it read, which the kernel shares between the ranks
of a node and may drop) in their own column. The last lines extrapolate each figure to
``--extrapolate`` samples by what it grows with (:func:`extrapolate`).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HELP = "simulate Loader start-up, epoch start and resume at large split and world sizes"


def _tiny_jpeg(k: int) -> bytes:
    from PIL import Image

    im = Image.new("RGB", (24, 20), ((37 * k) % 256, (91 * k) % 256, 120))
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=80)
    return buf.getvalue()


def build_split(root: Path, num_samples: int, per_shard: int) -> tuple[Path, float]:
    """A split of ``num_samples`` (one real shard hard-linked), its table built; returns the
    split and the seconds the table took to build (what ``stoker index`` / ``stoker pack`` pay
    once per split)."""
    from stoker.pipeline.shards.manifest import Manifest, ShardInfo
    from stoker.pipeline.shards.table import write_split_table
    from stoker.pipeline.shards.writer import ShardWriter

    if num_samples % per_shard:
        raise SystemExit(f"--samples {num_samples} must be a multiple of --samples-per-shard {per_shard}")
    split = root / f"n{num_samples}"
    base = root / f"base-{per_shard}.tar"
    if not base.exists():
        images = [_tiny_jpeg(k) for k in range(16)]
        with ShardWriter(base) as w:
            for i in range(per_shard):
                w.write(f"{i:09d}", {"jpg": images[i % 16], "cls": str(i % 1000).encode()})
        (root / "base.json").write_text(json.dumps(w.info.__dict__))
    info = json.loads((root / "base.json").read_text())
    split.mkdir(parents=True, exist_ok=True)
    shards = []
    for k in range(num_samples // per_shard):
        name = f"shard-{k:06d}.tar"
        for src, dst in ((base, split / name), (base.with_suffix(".idx"), split / f"shard-{k:06d}.idx")):
            if not dst.exists():
                os.link(src, dst)
        shards.append(ShardInfo(name, per_shard, info["bytes"], info["sha256"]))
    m = Manifest(num_samples=num_samples, classes=[str(c) for c in range(1000)], shards=shards, pack={})
    m.save(split)
    t0 = time.perf_counter()
    write_split_table(split, m)
    return split, time.perf_counter() - t0


def _memory() -> tuple[int, int]:
    """``(anonymous, file-backed)`` bytes resident: what this process holds, and the pages of
    mapped files (shards, the table) it has touched, which the kernel shares and may drop."""
    out = {}
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("Rss", "Anonymous"):
                out[key] = int(rest.split()[0]) * 1024
    return out["Anonymous"], out["Rss"] - out["Anonymous"]


def measure_rank(split, rank: int, world: int, batch: int, mix: dict | None = None) -> dict:
    """One rank's figures (run in a fresh process); ``split`` a path or, with ``mix`` (the
    Loader's ``weights=``/``balance=``), a list of them."""
    import warnings

    warnings.simplefilter("ignore")
    import torch  # noqa: F401 - imported before the baseline: every Loader imports it

    from stoker.pipeline import Loader

    kw = dict(batch_size=batch, rank=rank, world_size=world, crop=16, backend="pil", threads=0, seed=0, **(mix or {}))
    warm = Loader(split, **{**kw, "train": False})  # the decode path's modules imported once, measured out
    next(iter(warm))
    warm.close()
    base = _memory()
    t0 = time.perf_counter()
    loader = Loader(split, **kw)
    construct = time.perf_counter() - t0
    rss_construct = _memory()[0] - base[0]
    t0 = time.perf_counter()
    loader.set_epoch(1)
    it = iter(loader)
    next(it)
    epoch_start = time.perf_counter() - t0
    order_only = _timed(lambda: loader.indices(1))
    half = len(loader) // 2
    state = {**loader.state_dict(), "position": half * batch}
    it.close()
    rss_epoch = _memory()[0] - base[0]
    again = Loader(split, **kw)
    t0 = time.perf_counter()
    again.load_state_dict(state)
    next(iter(again))
    resume = time.perf_counter() - t0
    return {
        "construct_s": construct,
        "rss_construct": rss_construct,
        "epoch_start_s": epoch_start,
        "order_s": order_only,
        "resume_s": resume,
        "rss_after": _memory()[0] - base[0],
        "rss_epoch": rss_epoch,
        "file_mapped": _memory()[1] - base[1],
        "share": len(loader.indices(1)),
        "batches": len(loader),
    }


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _child(split, rank: int, world: int, batch: int, mix: dict | None = None) -> dict:
    paths = [str(p) for p in split] if isinstance(split, list) else str(split)
    cmd = [sys.executable, "-m", "stoker.benchmarks.scale", "--child", json.dumps([paths, rank, world, batch, mix])]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"rank {rank} of {world} on {split} failed: {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run(args: argparse.Namespace) -> list[dict]:
    root = Path(args.dir)
    root.mkdir(parents=True, exist_ok=True)
    rows = []
    for n in args.samples:
        split, build_s = build_split(root, n, args.samples_per_shard)
        print(f"split of {n:,} samples ({n // args.samples_per_shard:,} shards): table built in {build_s:.2f} s")
        split, mix = _mixed(root, split, n, args)
        for world in args.worlds:
            for rank in sorted({0, world - 1}):
                runs = [_child(split, rank, world, args.batch_size, mix) for _ in range(args.repeat)]
                row = {"samples": n, "shards": n // args.samples_per_shard, "world": world, "rank": rank}
                for key in ("construct_s", "epoch_start_s", "order_s", "resume_s"):
                    vals = [r[key] for r in runs]
                    row[key] = (min(vals), statistics.median(vals))
                for key in ("rss_construct", "rss_epoch", "rss_after", "file_mapped"):
                    row[key] = max(r[key] for r in runs)
                row["share"], row["build_s"] = runs[0]["share"], build_s
                rows.append(row)
                print(_line(row), flush=True)
    return rows


def _mixed(root: Path, split: Path, n: int, args: argparse.Namespace) -> tuple:
    """The Loader's split(s) and mix keywords for ``--mix``/``--balance`` (a second split a tenth
    the size; the class members files built once, timed), or ``(split, None)``."""
    if not (args.mix or args.balance):
        return split, None
    splits, mix = [split], {}
    if args.mix:
        small = max(args.samples_per_shard, n // 10 // args.samples_per_shard * args.samples_per_shard)
        splits.append(build_split(root, small, args.samples_per_shard)[0])
        mix["weights"] = [0.7, 0.3]
    if args.balance:
        from stoker.pipeline.balance_tables import class_members
        from stoker.pipeline.shards.samples import open_split

        mix["balance"] = "classes"
        for s in splits:
            t0 = time.perf_counter()
            class_members(open_split(s))
            print(f"{s.name}: class members built in {time.perf_counter() - t0:.2f} s (once per split)")
    return splits, mix


def _line(r: dict) -> str:
    ms = lambda v: f"{v[0] * 1e3:7.1f}/{v[1] * 1e3:7.1f}"  # noqa: E731
    mb = lambda v: f"{v / 2**20:7.1f}"  # noqa: E731
    return (
        f"{r['samples']:>11,} {r['world']:>5} {r['rank']:>5} {r['share']:>10,} {ms(r['construct_s'])} "
        f"{mb(r['rss_construct'])} {ms(r['epoch_start_s'])} {ms(r['order_s'])} {ms(r['resume_s'])} "
        f"{mb(r['rss_after'])} {mb(r['file_mapped'])}"
    )


HEADER = (
    f"{'samples':>11} {'W':>5} {'rank':>5} {'share':>10} {'construct ms':>15} {'+MB':>7} "
    f"{'epoch start ms':>15} {'order ms':>15} {'resume ms':>15} {'+MB end':>7} {'mapped':>7}"
)


def extrapolate(rows: list[dict], samples: int, per_shard: int, worlds: list[int], batch: int) -> list[str]:
    """Each figure by what it grows with, from the measurements, evaluated at ``samples``:

    * construction time and memory: ``a + b * shards`` (the manifest and a ``stat`` per shard;
      nothing per sample), fitted on the two largest splits' medians (ranks and worlds pooled);
    * the first batch after ``set_epoch`` and after a resume: one batch (the order is computed
      a batch at a time), plus opening the maps of the shards it reads, at most one a sample:
      the largest split's median, whose batch already reads ~``min(batch, shards)`` shards;
    * the rank's whole order (``loader.indices()``, which training does not build): per sample
      of the share, at the largest share measured.
    """
    sizes = sorted({r["samples"] for r in rows})
    big = [r for r in rows if r["samples"] == sizes[-1]]
    fit = {}
    for key, pick in (("construct_s", 1), ("rss_construct", None)):
        pts = [(r["shards"], r[key][pick] if pick is not None else r[key]) for r in rows if r["samples"] in sizes[-2:]]
        x, y = np.array(pts, float).T
        fit[key] = np.polyfit(x, y, 1) if len(set(x)) > 1 else np.array([0.0, y.mean()])
    start = statistics.median(r["epoch_start_s"][1] for r in big)
    resume = statistics.median(r["resume_s"][1] for r in big)
    widest = max(rows, key=lambda r: r["share"])
    per_sample = widest["order_s"][0] / widest["share"]
    shards = samples // per_shard
    lines = [
        f"extrapolated to {samples:,} samples ({shards:,} shards of {per_shard:,}), batch {batch}:",
        f"  construction {fit['construct_s'][0] * 1e6:.1f} us a shard + {fit['construct_s'][1] * 1e3:.1f} ms; "
        f"memory {fit['rss_construct'][0]:.0f} B a shard; first batch {start * 1e3:.0f} ms, resumed "
        f"{resume * 1e3:.0f} ms (median at {sizes[-1]:,}); the whole order {per_sample * 1e9:.0f} ns a sample",
    ]
    construct = float(np.polyval(fit["construct_s"], shards))
    memory = float(np.polyval(fit["rss_construct"], shards))
    for world in worlds:
        share = samples // world
        lines.append(
            f"  W={world:>5}: share {share:>13,}  construct {construct:6.2f} s  +{memory / 2**20:7.1f} MB  "
            f"first batch {start:5.2f} s  resume {resume:5.2f} s  (whole order, if built: {share * per_sample:8.1f} s, "
            f"{share * 8 / 2**30:6.2f} GiB)"
        )
    return lines


def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m stoker.benchmarks.scale", description=__doc__.split("\n\n")[0])
    ints = lambda s: [int(float(v)) for v in s.split(",")]  # noqa: E731
    p.add_argument("--dir", default="/tmp/stoker-scale", help="where the splits are built (kept for reruns)")
    p.add_argument("--samples", type=ints, default=[1_000_000, 10_000_000], help="split sizes (comma-separated)")
    p.add_argument("--worlds", type=ints, default=[1, 8, 64, 512], help="world sizes (comma-separated)")
    p.add_argument("--samples-per-shard", type=int, default=10_000)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--repeat", type=int, default=3, help="runs per rank (min/median reported)")
    p.add_argument("--extrapolate", type=int, default=2_000_000_000, help="samples to extrapolate to")
    p.add_argument("--json", metavar="FILE", help="write the rows as JSON")
    p.add_argument("--mix", action="store_true", help="a 2-split mix: the split and one a tenth its size, 0.7/0.3")
    p.add_argument("--balance", action="store_true", help='balance the classes (balance="classes")')
    p.add_argument("--child", help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    if args.child:
        split, rank, world, batch, mix = json.loads(args.child)
        print(json.dumps(measure_rank(split, rank, world, batch, mix)))
        return 0
    print(HEADER)
    rows = run(args)
    print("\n".join(extrapolate(rows, args.extrapolate, args.samples_per_shard, args.worlds, args.batch_size)))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
