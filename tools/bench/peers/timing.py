"""How `stoker bench` times a pipeline: images/s, CPU % and peak RSS of a process tree.

Standard library only (torch imported lazily, for a CUDA sync), so the FFCV peer can import it
when run by file path under an interpreter that has no stoker.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator


def tree_pids(root: int) -> list[int]:
    """``root`` and its live descendants (from /proc)."""
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


def tree_cpu() -> float:
    """CPU seconds (user+system) of this process and its descendants: this process and the
    children it reaped from ``getrusage`` (exact), the live descendants and the children they
    reaped (a fork server's finished workers) from /proc (in clock ticks)."""
    import resource

    own, reaped = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    total = own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime
    tick = os.sysconf("SC_CLK_TCK")
    for pid in tree_pids(os.getpid())[1:]:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += sum(int(v) for v in fields[11:15]) / tick  # utime, stime, cutime, cstime
        except (OSError, IndexError, ValueError):
            pass
    return total


def tree_peak_rss() -> int:
    """Sum of peak RSS (VmHWM) over this process and its live descendants, bytes."""
    total = 0
    for pid in tree_pids(os.getpid()):
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


def timed(batches: Iterable, cfg: dict) -> dict:
    """Consume an iterator of ``(images, labels)``; warm-up excluded; stop at the time limit.

    Args:
        batches: Yields ``(images, labels)`` with tensor-like images (``len``, ``numel``,
            ``element_size``).
        cfg: ``warmup`` (batches not timed) and ``seconds`` (time limit after the warm-up).

    Returns:
        ``images``, ``seconds``, ``img_s``, ``cpu_pct``, ``cpu_s_per_1k``, ``peak_rss`` and
        ``bytes_per_batch``.
    """
    warmup, limit = cfg["warmup"], cfg["seconds"]
    n = nbatches = 0
    bytes_per_batch = 0
    t0 = cpu0 = None
    peak = 0
    images = None
    for k, (images, _labels) in enumerate(batches):
        if k == warmup:
            t0, cpu0 = time.perf_counter(), tree_cpu()
        elif k > warmup:
            n += len(images)
            nbatches += 1
            bytes_per_batch = max(bytes_per_batch, images.numel() * images.element_size())
            if k % 8 == 0:
                peak = max(peak, tree_peak_rss())
            if time.perf_counter() - t0 > limit:
                break
    if t0 is None or n == 0:
        raise RuntimeError("not enough batches to measure (lower --warmup or use more data)")
    if getattr(images, "is_cuda", False):  # batches made on the GPU: count only finished work
        import torch

        torch.cuda.synchronize(images.device)
    wall = time.perf_counter() - t0
    return row(n, wall, tree_cpu() - cpu0, max(peak, tree_peak_rss()), bytes_per_batch)


def row(images: int, wall: float, cpu: float, peak_rss: int, bytes_per_batch: int) -> dict:
    """One measured pipeline, as every benchmark row reports it (``cpu_s_per_1k``: CPU seconds of
    all its processes per 1,000 images, what a node's cores per GPU must supply)."""
    return {
        "images": images,
        "seconds": wall,
        "img_s": images / wall,
        "cpu_pct": 100 * cpu / wall,
        "cpu_s_per_1k": 1000 * cpu / images,
        "peak_rss": peak_rss,
        "bytes_per_batch": bytes_per_batch,
    }


def epochs(make_epoch: Callable[[int], Iterable], count: int) -> Iterator:
    """The batches of epochs ``0 .. count-1``, one after the other."""
    for e in range(count):
        yield from make_epoch(e)
