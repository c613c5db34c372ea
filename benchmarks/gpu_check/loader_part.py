"""The GPU check's loader part: the Loader's nvjpeg and pil backends, the decoded-pixel tier (RGB
and YUV 4:2:0 stores: the filling epoch and the warm ones), then the nvjpeg backend's variants
(each decoder, overlap off, nvImageCodec's hardware share 0 and 1, region decode off), then the
nvjpeg stages one at a time.

Each row is the Loader's train batches on the device, images/s over ``loader_seconds`` (the
variants over a third of it), with the runner's per-stage busy seconds and how much they
overlapped (their sum over the wall time: 1 when one ran after the other).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .proc import Skip, one_line, time_left


def _measure_loader(ctx: dict, backend: str, device: str, *, seconds: float | None = None, **runner_kw: Any) -> dict:
    """One Loader row; ``runner_kw`` given: the nvjpeg backend configured with them (on the CPU,
    the smoke run's :func:`_nvjpeg_on_cpu`)."""
    from stoker.pipeline import Loader
    from stoker.pipeline.backends import get_backend
    from stoker.tools.bench.peers.timing import epochs, timed

    chosen: Any = backend
    if runner_kw:
        chosen = get_backend("nvjpeg", **runner_kw) if device.startswith("cuda") else _nvjpeg_on_cpu(**runner_kw)
    loader = Loader(
        ctx["split"], batch_size=ctx["batch_size"], crop=ctx["crop"], backend=chosen, device=device, train=True
    )
    try:

        def epoch(e):
            loader.set_epoch(e)
            return iter(loader)

        cfg = {"warmup": 3 if not ctx["smoke"] else 1, "seconds": seconds or ctx["loader_seconds"]}
        r = timed(epochs(epoch, 10**6), cfg)
        runner = loader.runner
        r.update({"backend": loader.backend, "device": device, "gpu_fallbacks": getattr(runner, "gpu_fallbacks", None)})
        if hasattr(runner, "stage_totals"):  # the nvjpeg runner: where its time went, warm-up included
            tot = runner.stage_totals
            r["decoder"] = runner.decoder.name
            r["decoder_why"] = runner.decoder_reason
            r["stages"] = {f"{k}_s": round(tot[k], 3) for k in ("read", "decode", "crop_resize", "wall")}
            r["overlap_ratio"] = runner.clock.ratio(tot)
        return r
    finally:
        loader.close()


def _measure_pixels(ctx: dict, device: str, pixel_format: str) -> dict:
    """The pixel tier's row: a fresh store (under the check's output folder, removed after), its
    filling first epoch timed whole, then the warm epochs as every row is timed. On a GPU the store
    is filled by the nvjpeg backend's decoder and cropped and resized on the device."""
    import shutil
    import tempfile

    from stoker.pipeline import Loader
    from stoker.pipeline.pixels import PixelCache
    from stoker.tools.bench.peers.timing import epochs, timed

    root = tempfile.mkdtemp(prefix="stoker-pixels-", dir=ctx["out"])
    loader = None
    try:
        loader = Loader(
            ctx["split"],
            batch_size=ctx["batch_size"],
            crop=ctx["crop"],
            backend="nvjpeg" if device.startswith("cuda") else "pil",
            device=device,
            train=True,
            pixel_cache=PixelCache(root, pixel_format=pixel_format, fill="inline"),  # epoch 0 fills it all
        )
        t0, n = time.perf_counter(), 0
        for x, _ in loader:  # epoch 0 fills the store
            n += len(x)
        if device.startswith("cuda"):
            import torch

            torch.cuda.synchronize()
        fill = n / (time.perf_counter() - t0)

        def epoch(e):
            loader.set_epoch(e + 1)
            return iter(loader)

        cfg = {"warmup": 3 if not ctx["smoke"] else 1, "seconds": ctx["loader_seconds"]}
        r = timed(epochs(epoch, 10**6), cfg)
        runner = loader.runner
        r.update(
            {
                "backend": f"{loader.backend} + pixel tier ({pixel_format})",
                "device": device,
                "fill_img_s": fill,
                "decoded": getattr(runner, "decoded", None),
                "from_store": getattr(runner, "from_store", None),
                "store_bytes": loader.pixel_store.stats()["bytes"],
            }
        )
        return r
    finally:
        if loader is not None:
            loader.close()
        shutil.rmtree(root, ignore_errors=True)


def _nvjpeg_on_cpu(**options: Any):
    """The nvjpeg backend as the smoke run (no GPU) needs it, configured with ``options``: its
    runner's code on the CPU with CPU decoders (a backend of its own, never registered, so never
    a ``--backend`` choice)."""
    from stoker.pipeline.backends.registry import NvjpegBackend

    class NvjpegOnCpu(NvjpegBackend):
        where = ("cpu",)

        def available(self, device, *, decoder=None):
            return True, "the smoke run: the nvjpeg runner's code with CPU decoders"

    return NvjpegOnCpu(**options)


def _nvjpeg_stages(ctx: dict, device: str, batches: int = 8) -> dict:
    """Where the nvjpeg backend's time goes, one synchronized stage at a time on one thread
    (no overlap, first batch not counted): reading bytes, decoding (the decoder ``auto`` picks,
    whole images), cropping + resizing."""
    import torch

    from stoker.model.throughput import synchronize
    from stoker.pipeline import augment
    from stoker.pipeline.backends import decoders
    from stoker.pipeline.backends.decoders import resolve_decoder
    from stoker.pipeline.backends.nvjpeg import crop_resize
    from stoker.pipeline.shards.samples import open_split

    name, _ = resolve_decoder("auto", device)
    decoder = decoders.make(name)
    idx = open_split(ctx["split"])
    dev, B, c = torch.device(device), ctx["batch_size"], ctx["crop"]
    took = {"read": 0.0, "decode": 0.0, "crop_resize": 0.0}
    n = 0
    starts = range(0, len(idx.valid) - B + 1, B)
    for j, s in enumerate(list(starts)[: batches + 1]):
        ids = idx.valid[s : s + B]
        t0 = time.perf_counter()
        enc, wh = idx.images(ids)
        datas = [torch.from_numpy(e.copy()) for e in enc]
        t1 = time.perf_counter()
        decoded, _, _ = decoders.decode_batch(decoder.decode, datas, device=dev, name=name)
        synchronize(dev)
        t2 = time.perf_counter()
        boxes, flips = augment.random_resized_crop(wh, ids, seed=0, epoch=0)
        out = torch.empty(B, 3, c, c, dtype=torch.uint8, device=dev)
        crop_resize(decoded, boxes, flips, out)
        synchronize(dev)
        t3 = time.perf_counter()
        if j:  # the first batch warms up the decoder and the kernels
            n += B
            for key, dt in (("read", t1 - t0), ("decode", t2 - t1), ("crop_resize", t3 - t2)):
                took[key] += dt
    idx.close()
    if not n:
        raise RuntimeError(f"fewer than 2 batches of {B} to time the stages")
    return {"batches": n // B, "device": device, "decoder": name, **{f"{k}_img_s": n / v for k, v in took.items()}}


def variant_plan(cuda: bool, available: dict[str, bool], auto: str) -> list[dict]:
    """The nvjpeg runner's variants worth a row: each other decoder that works here, overlap off,
    for nvImageCodec (when it works) its hardware share at 0 and 1 (CUDA only) and region decode
    off, and last (CUDA only) the default with each stage's stream synchronized at its end, so
    the stage seconds hold the GPU's time too (a host-side busy time misses queued kernels).
    ``available``: decoder name -> works; ``auto``: the default rows' decoder."""
    rows = [{"label": f"decoder {n}", "decoder": n} for n, ok in available.items() if ok and n != auto]
    rows.append({"label": "overlap off", "overlap": False})
    if available.get("nvimgcodec"):
        if cuda:
            rows += [{"label": f"hw share {hw:g}", "decoder": "nvimgcodec", "hw_decoder_load": hw} for hw in (0.0, 1.0)]
        rows.append({"label": "region decode off", "decoder": "nvimgcodec", "region": False})
    if cuda:
        rows.append({"label": "stages synchronized", "stage_sync": True})
    return rows


def _variants(ctx: dict, device: str, out: list, save: Callable[[], None]) -> None:
    """Measure each of :func:`variant_plan`'s rows into ``out`` while the part's time box allows."""
    from stoker.pipeline.backends import decoders
    from stoker.pipeline.backends.decoders import resolve_decoder

    auto, _ = resolve_decoder("auto", device)
    available = {n: decoders.probe(n, device)[0] for n in decoders.NAMES}
    seconds = max(1.0, ctx["loader_seconds"] / 3)
    for v in variant_plan(ctx["cuda"], available, auto):
        knobs = {k: v[k] for k in ("decoder", "overlap", "region", "hw_decoder_load", "stage_sync") if k in v}
        row = {"label": v["label"], **knobs}
        try:
            if time_left(ctx) < seconds + 15:  # its start, warm-up and close besides the timed seconds
                raise Skip("time box")
            row.update(_measure_loader(ctx, "nvjpeg" if ctx["cuda"] else "pil", device, seconds=seconds, **knobs))
        except (Skip, TimeoutError) as e:
            row["skipped"] = f"not run: {e}"
        except Exception as e:  # boundary: reported in its own row; one variant failing must not lose the others
            row["error"] = one_line(e)
        out.append(row)
        save()


def part_loader(ctx: dict, save: Callable[[dict], None]) -> dict:
    if not ctx.get("split"):
        raise Skip("no packed data (the data part did not finish)")
    device = "cuda" if ctx["cuda"] else "cpu"
    result: dict[str, Any] = {"batch_size": ctx["batch_size"], "crop": ctx["crop"], "device": device, "rows": {}}
    if not ctx["cuda"]:
        result["rows"]["nvjpeg"] = {"skipped": "no CUDA device (nvjpeg decodes on the GPU)"}
    for backend in ("nvjpeg", "pil") if ctx["cuda"] else ("pil",):
        try:
            result["rows"][backend] = _measure_loader(ctx, backend, device)
        except Exception as e:  # boundary: reported in its own row; one backend failing must not lose the other
            result["rows"][backend] = {"error": one_line(e)}
        save(result)
        print(f"loader: {backend} done {time.time() - ctx['started']:.1f} s into the box", flush=True)
    for fmt in ("rgb", "yuv420"):  # the decoded-pixel tier (the GPU target: >= 45,000 img/s at crop 224)
        try:
            result["rows"][f"pixels-{fmt}"] = _measure_pixels(ctx, device, fmt)
        except Exception as e:  # boundary: reported in its own row; one row failing must not lose the others
            result["rows"][f"pixels-{fmt}"] = {"error": one_line(e)}
        save(result)
        print(f"loader: pixel tier ({fmt}) done {time.time() - ctx['started']:.1f} s into the box", flush=True)
    if ctx["cuda"] or ctx["smoke"]:  # on the CPU (smoke) the nvjpeg runner's code runs with CPU decoders
        result["variants"] = []
        _variants(ctx, device, result["variants"], lambda: save(result))
        print(f"loader: variants done {time.time() - ctx['started']:.1f} s into the box", flush=True)
        try:
            result["nvjpeg_stages"] = _nvjpeg_stages(ctx, device)
        except Exception as e:  # boundary: reported in its own row (a diagnostic: recorded, not fatal)
            result["nvjpeg_stages"] = {"error": one_line(e)}
        save(result)
    nv, pil = (result["rows"][b].get("img_s") for b in ("nvjpeg", "pil"))
    result["nvjpeg_vs_pil"] = nv / pil if nv and pil else None
    if all("error" in r for r in result["rows"].values() if "skipped" not in r):
        raise RuntimeError("; ".join(f"{b}: {r['error']}" for b, r in result["rows"].items() if "error" in r))
    return result
