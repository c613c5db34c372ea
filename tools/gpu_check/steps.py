"""The parts of the GPU check (``stoker gpu-check``): what each one measures.

Each part runs in a process of its own (``python -m stoker.tools.gpu_check.steps PART CTX``,
see :mod:`.proc`). A part gets ``ctx``, the check's settings as a JSON-ready dict
(``out``, ``data``, ``batch_size``, ``crop``, ``repeat``, ``synthetic``, ``loader_seconds``,
``model_seconds``, ``train_epochs``, ``cuda``, ``smoke``, ``split``, ``root``, plus its
``record``, ``limit`` and ``started``), and ``save(result)`` to record what it finished so
far; it returns its result, or raises :class:`~.proc.Skip` (does not apply here),
TimeoutError (its time box) or anything else (failed).

One module past 400 lines: one function per part, each a few dozen lines, sharing helpers.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stoker.errors import UsageError

from .proc import PartFunc, Skip, one_line, run_child, run_group, time_left


def part_environment(ctx: dict, save: Callable[[dict], None]) -> dict:
    import platform

    import torch

    from stoker.pipeline.deps import HAS_DALI, gpu_jpeg_decode, pillow_info, resolve_backend, usable_cores

    from ..diagnose.measure import dist_version

    cuda = torch.cuda.is_available()
    backend, why = resolve_backend("auto", "cuda" if cuda else "cpu")
    works, probe = gpu_jpeg_decode()
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torchvision": dist_version("torchvision"),
        "cuda": cuda,
        "cuda_version": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(0) if cuda else None,
        "gpu_count": torch.cuda.device_count() if cuda else 0,
        "gpu_bf16": bool(cuda and torch.cuda.is_bf16_supported()),
        "dali": HAS_DALI,
        "pillow": pillow_info(),
        "usable_cores": usable_cores(),
        "auto_backend": backend,
        "auto_backend_why": why,
        "gpu_jpeg_decode": works,
        "gpu_jpeg_decode_why": probe,
        # what the other parts need besides torch (a missing one explains a failed part)
        "modules": {
            names[0]: dist_version(*names)
            for names in (("numpy",), ("pillow", "pillow-simd"), ("tqdm",), ("pytest",), ("webdataset",))
        },
    }


def part_pytest(ctx: dict, save: Callable[[dict], None]) -> dict:
    import importlib.util
    import re

    import stoker

    if not ctx["cuda"]:
        raise Skip("no CUDA device: every gpu test would skip")
    if importlib.util.find_spec("pytest") is None:
        raise Skip("pytest is not installed in this python")
    root = Path(stoker.__file__).resolve().parent
    # a test module whose optional import is missing there (Lightning, timm) must not stop the rest
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-m",
        "gpu",
        "-q",
        "-p",
        "no:cacheprovider",
        "--continue-on-collection-errors",
        "-rA",  # the passed tests' output too (the nvJPEG vs CPU difference they print)
        "tests",
    ]
    proc = run_group(cmd, timeout=time_left(ctx), cwd=root)
    print(proc.stdout, proc.stderr, sep="\n", flush=True)  # into the part's log: failures in full
    lines = proc.stdout.strip().splitlines()
    summary = next(
        (ln.strip("= ") for ln in reversed(lines) if re.search(r"\d+ (passed|failed|skipped|error)", ln)),
        lines[-1] if lines else "no output",
    )
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", summary)}
    failures = [ln[len("FAILED ") :][:200] for ln in lines if ln.startswith(("FAILED ", "ERROR "))]
    result = {
        "command": " ".join(cmd[1:]),
        "returncode": proc.returncode,
        "summary": summary,
        "passed": counts.get("passed", 0),
        "failed": counts.get("failed", 0),
        "skipped": counts.get("skipped", 0),
        "errors": counts.get("error", 0) + counts.get("errors", 0),
        "failures": failures,
    }
    if proc.returncode not in (0, 5):  # 5: nothing collected
        save(result)
        raise RuntimeError(f"pytest -m gpu: {summary}")
    return result


def _image_files(src: Path) -> list[tuple[Path, str]]:
    """``(path, class)`` of the images of ``src``: class subfolders, or one class for a flat folder."""
    from stoker.pipeline.shards.samples import IMAGE_EXTS

    exts = {f".{e}" for e in IMAGE_EXTS}
    out = []
    for dirpath, dirnames, filenames in os.walk(src):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        rel = Path(dirpath).relative_to(src)
        cls = rel.parts[0] if rel.parts else "all"
        out += [
            (Path(dirpath) / f, cls)
            for f in sorted(filenames)
            if not f.startswith(".") and Path(f).suffix.lower() in exts
        ]
    return out


def _unpack(split: Path, dst: Path) -> None:
    """Write the images of a packed split back out as an ImageFolder (``dst/<label>/<key>.jpg``),
    so a small packed dataset (what fits on a machine without network) can be packed repeated."""
    from stoker.pipeline.shards.samples import KIND_PNG, SampleIndex

    idx = SampleIndex(split)
    try:
        for i in idx.valid.tolist():
            folder = dst / f"{idx.label(i):05d}"
            folder.mkdir(parents=True, exist_ok=True)
            ext = "png" if idx.kind[i] == KIND_PNG else "jpg"
            (folder / f"{idx.key(i)}.{ext}").write_bytes(idx.image(i).tobytes())
    finally:
        idx.close()


def part_data(ctx: dict, save: Callable[[dict], None]) -> dict:
    import shutil

    from stoker.pipeline.shards.manifest import MANIFEST_NAME, Manifest, check_shards

    from ..pack import pack

    out = Path(ctx["out"])
    data = Path(ctx["data"]) if ctx["data"] else None
    packed = next((p for p in ([data, data / "train"] if data else []) if (p / MANIFEST_NAME).exists()), None)
    if packed is not None and ctx["repeat"] == 1:  # used as it is
        m = Manifest.load(packed)
        return {
            "split": str(packed),
            "root": str(packed.parent),
            "samples": m.num_samples,
            "packed_here": False,
            "source": str(data),
            "pack": m.pack,
        }
    if packed is not None:
        check_shards(packed, Manifest.load(packed))  # a damaged shard is named here, not half-unpacked
        data = out / "unpacked"
        if not data.exists():
            _unpack(packed, data.with_name("unpacked.tmp"))
            os.replace(data.with_name("unpacked.tmp"), data)
    elif data is None:
        from ..common.synth import make_image_folder

        data = out / "synthetic"
        per_class = max(1, ctx["synthetic"] // 6)
        # ImageNet-like sizes (its median is 500x375)
        make_image_folder(data, per_class=per_class, min_side=300, max_side=500, seed=0)
    files = _image_files(data)
    if not files:
        raise UsageError(f"--data {data} holds no images")
    src = out / "src"
    for k in range(ctx["repeat"]):
        for path, cls in files:
            (src / cls).mkdir(parents=True, exist_ok=True)
            dst = src / cls / f"r{k}_{path.name}"
            if dst.exists():
                continue
            if k == 0:
                os.symlink(path.resolve(), dst)
            else:  # copies: the packer counts a file (an inode) once, however many links name it
                shutil.copyfile(path, dst)
    root = out / "packed"
    if not (root / "train" / MANIFEST_NAME).exists():
        pack(src, root)  # the default settings, quietly
    m = Manifest.load(root / "train")
    return {
        "split": str(root / "train"),
        "root": str(root),
        "samples": m.num_samples,
        "packed_here": True,
        "source": str(ctx["data"] or data),
        "images": len(files),
        "repeat": ctx["repeat"],
        "pack": m.pack,
    }


def _measure_loader(ctx: dict, backend: str, device: str) -> dict:
    from stoker.pipeline import Loader

    from ..bench.peers.timing import epochs, timed

    loader = Loader(
        ctx["split"], batch_size=ctx["batch_size"], crop=ctx["crop"], backend=backend, device=device, train=True
    )

    def epoch(e):
        loader.set_epoch(e)
        return iter(loader)

    r = timed(epochs(epoch, 10**6), {"warmup": 3 if not ctx["smoke"] else 1, "seconds": ctx["loader_seconds"]})
    r.update(
        {"backend": loader.backend, "device": device, "gpu_fallbacks": getattr(loader._runner, "gpu_fallbacks", None)}
    )
    return r


def _nvjpeg_stages(ctx: dict, device: str, batches: int = 8) -> dict:
    """Where the nvjpeg backend's time goes, one synchronized stage at a time on one thread
    (no overlap, first batch not counted): reading bytes, decoding, cropping + resizing."""
    import torch

    from stoker.model.throughput import synchronize
    from stoker.pipeline import augment
    from stoker.pipeline.backends.nvjpeg import crop_resize, decode_jpegs
    from stoker.pipeline.shards.samples import open_split

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
        decoded = decode_jpegs(datas, dev)
        synchronize(dev)
        t2 = time.perf_counter()
        boxes, flips = augment.random_resized_crop(wh, ids, seed=0, epoch=0)
        out = torch.empty(B, 3, c, c, dtype=torch.uint8, device=dev)
        crop_resize(decoded, boxes, flips, out)
        synchronize(dev)
        t3 = time.perf_counter()
        if j:  # the first batch warms up nvJPEG and the kernels
            n += B
            for key, dt in (("read", t1 - t0), ("decode", t2 - t1), ("crop_resize", t3 - t2)):
                took[key] += dt
    idx.close()
    if not n:
        raise RuntimeError(f"fewer than 2 batches of {B} to time the stages")
    return {"batches": n // B, "device": device, **{f"{k}_img_s": n / v for k, v in took.items()}}


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
        except Exception as e:  # noqa: BLE001 - one backend failing must not lose the other
            result["rows"][backend] = {"error": one_line(e)}
        save(result)
        print(f"loader: {backend} done {time.time() - ctx['started']:.1f} s into the box", flush=True)
    if ctx["cuda"] or ctx["smoke"]:
        try:
            result["nvjpeg_stages"] = _nvjpeg_stages(ctx, device)
        except Exception as e:  # noqa: BLE001 - a diagnostic: its failure is recorded, not fatal
            result["nvjpeg_stages"] = {"error": one_line(e)}
        save(result)
    nv, pil = (result["rows"][b].get("img_s") for b in ("nvjpeg", "pil"))
    result["nvjpeg_vs_pil"] = nv / pil if nv and pil else None
    if all("error" in r for r in result["rows"].values() if "skipped" not in r):
        raise RuntimeError("; ".join(f"{b}: {r['error']}" for b, r in result["rows"].items() if "error" in r))
    return result


def _model_plan(ctx: dict) -> tuple[dict, list]:
    """bench-model settings, the most telling first (the time box may cut the tail)."""
    if not ctx["cuda"]:
        return (
            {"batch_size": 2, "image_size": 32, "seconds": 0.05, "steps_min": 1, "warmup_steps": 1},
            [("resnet18", "fp32", False, False), ("resnet18", "fp32", True, False)],
        )
    settings = {
        "batch_size": ctx["batch_size"],
        "image_size": ctx["crop"],
        "seconds": ctx["model_seconds"],
        "steps_min": 5,
        "warmup_steps": 3,
    }
    combos = []
    for compiled in (False, True):
        for m in ("resnet50", "inception"):
            for a in ("bf16", "fp16", "fp32"):
                for cl in (True, False):
                    combos.append((m, a, cl, compiled))
    return settings, combos


def part_bench_model(ctx: dict, save: Callable[[dict], None]) -> dict:
    if not ctx["cuda"] and not ctx["smoke"]:
        raise Skip("no CUDA device (model speed on the CPU is `stoker bench-model --device cpu`)")
    from ..bench.model import add_speedups, bench_model

    settings, combos = _model_plan(ctx)
    deadline = time.monotonic() + time_left(ctx)
    result: dict[str, Any] = {**settings, "rows": [], "not_run": []}
    slowest = 0.0
    for m, a, cl, co in combos:
        # a compiled setting costs a compile: leave it out when it cannot finish in time
        need = max(slowest, 60.0 if co else 5.0) if ctx["cuda"] else 0.0
        if time.monotonic() + need > deadline:
            result["not_run"].append({"model": m, "amp": a, "channels_last": cl, "compile": co})
            continue
        t = time.monotonic()
        res = bench_model(
            [m],
            device="cuda" if ctx["cuda"] else "cpu",
            amps=[a],
            channels_last="on" if cl else "off",
            compile="on" if co else "off",
            progress=False,
            **settings,
        )
        slowest = max(slowest, time.monotonic() - t) if co else slowest
        result.update({"device_name": res.device_name, "torch": res.torch})
        result["rows"] += res.rows
        save(result)
    if not result["rows"]:
        raise TimeoutError(f"no setting fits in the {ctx['limit']:.0f} s time box")
    add_speedups(result["rows"])
    return result


def part_train(ctx: dict, save: Callable[[dict], None]) -> dict:
    if not ctx.get("root"):
        raise Skip("no packed data (the data part did not finish)")
    if not ctx["cuda"] and not ctx["smoke"]:
        raise Skip("no CUDA device")
    run = Path(ctx["out"]) / "train-run"
    if ctx["cuda"]:
        args = [
            "--arch",
            "resnet50",
            "--epochs",
            str(ctx["train_epochs"]),
            "--batch-size",
            str(ctx["batch_size"]),
            "--crop",
            str(ctx["crop"]),
            "--amp",
            "bf16",
            "--channels-last",
            "--device",
            "cuda",
            "--log-every",
            "5",
        ]
    else:
        args = [
            "--arch",
            "resnet18",
            "--epochs",
            "1",
            "--batch-size",
            "4",
            "--crop",
            "32",
            "--amp",
            "off",
            "--device",
            "cpu",
            "--log-every",
            "2",
            "--threads",
            "1",
        ]
    cmd = [
        sys.executable,
        "-m",
        "stoker.tools.cli",
        "train",
        ctx["root"],
        "--out",
        str(run),
        *args,
        "--json",
        "--no-progress",
    ]
    proc = run_group(cmd, timeout=time_left(ctx))
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"stoker train exited {proc.returncode}: {tail[:250]}")
    s = json.loads(proc.stdout[proc.stdout.index("{") :])
    keep = ("arch", "device", "amp", "epochs", "steps", "seconds", "images_per_s", "data_wait", "train_loss")
    return {"command": "stoker " + " ".join(cmd[3:]), **{k: s.get(k) for k in keep}}


#: the parts, in the order they run
PART_FUNCS: dict[str, PartFunc] = {
    "environment": part_environment,
    "pytest": part_pytest,
    "data": part_data,
    "loader": part_loader,
    "bench-model": part_bench_model,
    "train": part_train,
}
PARTS = tuple(PART_FUNCS)


if __name__ == "__main__":  # a part's process, started by gpu_check_proc.run_part
    run_child(PART_FUNCS, sys.argv[1:])
