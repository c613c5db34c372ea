"""The plain packing loop `stoker bench-pack` compares stoker pack against.

What a stock script does: webdataset's ShardWriter fed by Pillow (``Image.open``,
``convert("RGB")``, bicubic resize to the short side, JPEG save, no draft mode), in a process
pool with ordered results. Standard library + Pillow + webdataset only (no stoker, no torch), so
``--plain-python`` can run it by file path with another interpreter, e.g. a venv with stock
Pillow from PyPI::

    echo '{"items": [["a.jpg", 0]], "out": "/tmp/o", "workers": 2, "short_side": 256, "quality": 90}' \\
        | python /path/to/stoker/tools/peers/plain_pack.py

stdin holds the config: ``items`` (``[path, label]`` pairs), ``out``, ``workers``,
``short_side`` and ``quality``; or ``{"info": true}`` for :func:`pillow`. Prints
``RESULT {json}``. In-process, `stoker bench-pack` imports it and calls :func:`measure`.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import time

try:
    from .timing import tree_cpu
except ImportError:  # run by file path: import its neighbour by path
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from timing import tree_cpu


def target(w: int, h: int, short_side: int) -> tuple[int, int]:
    """Size after scaling the short side down to ``short_side`` (never up; 0 keeps the size)."""
    if not short_side:
        return w, h
    s = short_side / min(w, h)
    if s >= 1:
        return w, h
    return max(1, round(w * s)), max(1, round(h * s))


def encode(job: tuple[str, int, int]) -> bytes:
    """The stock way to re-encode one image (module level: picklable for the pool)."""
    from PIL import Image

    path, short_side, quality = job
    im = Image.open(path).convert("RGB")
    size = target(*im.size, short_side)
    if size != im.size:
        im = im.resize(size, Image.Resampling.BICUBIC)
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=quality)
    return buf.getvalue()


def pack(items: list, out: str, workers: int, short_side: int, quality: int) -> int:
    """Write ``items`` (``[path, label]``) as webdataset shards ``out/plain-%06d.tar``; returns the count."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    import webdataset as wds

    jobs = [(path, short_side, quality) for path, _ in items]
    os.makedirs(out, exist_ok=True)
    n = 0
    with contextlib.ExitStack() as stack:
        if workers > 1:
            # a fork server, not fork (this process may run threads); a dead worker raises, never hangs
            pool = stack.enter_context(ProcessPoolExecutor(workers, mp.get_context("forkserver")))
            results = pool.map(encode, jobs, chunksize=8)
        else:
            results = map(encode, jobs)
        sink = stack.enter_context(wds.ShardWriter(os.path.join(out, "plain-%06d.tar"), maxsize=256e6, verbose=0))
        for i, ((_, label), data) in enumerate(zip(items, results, strict=True)):
            sink.write({"__key__": f"{i:09d}", "jpg": data, "cls": label})
            n += 1
    return n


def cpu_seconds() -> float:
    """CPU time of this process and its descendants, the pool's workers included (alive, or
    reaped by the fork server): images per CPU-second is the per-core cost, unlike wall time
    unaffected by other load."""
    return tree_cpu()


def pillow() -> dict:
    """This interpreter's Pillow: ``version``, ``simd`` (pillow-simd?), ``libjpeg_turbo``, ``python``."""
    from importlib.metadata import PackageNotFoundError, version

    import PIL
    from PIL import features

    try:
        version("pillow-simd")
        simd = True
    except PackageNotFoundError:
        simd = False
    return {
        "version": PIL.__version__,
        "simd": simd,
        "libjpeg_turbo": bool(features.check_feature("libjpeg_turbo")),
        "python": sys.executable,
    }


def measure(cfg: dict) -> dict:
    """:func:`pack` timed: ``{"count", "wall", "cpu"}`` (imports before the clock, as on the stoker side)."""
    import webdataset  # noqa: F401
    from PIL import Image

    Image.init()
    c0, t0 = cpu_seconds(), time.perf_counter()
    n = pack(cfg["items"], cfg["out"], cfg["workers"], cfg["short_side"], cfg["quality"])
    return {"count": n, "wall": time.perf_counter() - t0, "cpu": cpu_seconds() - c0}


def main() -> int:
    cfg = json.loads(sys.stdin.read())
    res = pillow() if cfg.get("info") else measure(cfg)
    print("RESULT " + json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
