"""The parts of the GPU check (``stoker gpu-check``): what each one measures.

Each part runs in a process of its own (``python -m stoker.benchmarks.gpu_check.steps PART CTX``,
see :mod:`.proc`). A part gets ``ctx``, the check's settings as a JSON-ready dict
(``out``, ``data``, ``batch_size``, ``crop``, ``repeat``, ``synthetic``, ``loader_seconds``,
``model_seconds``, ``train_epochs``, ``cuda``, ``smoke``, ``split``, ``root``, plus its
``record``, ``limit`` and ``started``), and ``save(result)`` to record what it finished so
far; it returns its result, or raises :class:`~.proc.Skip` (does not apply here),
TimeoutError (its time box) or anything else (failed). The loader part is :mod:`.loader_part`'s.
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

from .loader_part import part_loader
from .proc import PartFunc, Skip, run_child, run_group, time_left


def part_environment(ctx: dict, save: Callable[[dict], None]) -> dict:
    import platform

    import torch

    from stoker.model.train.runtime import gpu_bf16
    from stoker.pipeline.backends import decoders, resolve_backend
    from stoker.pipeline.backends.decoders import gpu_jpeg_decode, resolve_decoder
    from stoker.pipeline.deps import HAS_DALI, pillow_info, usable_cores
    from stoker.tools.diagnose.measure import dist_version

    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    chosen, why = resolve_backend("auto", device, decoder="auto")  # the Loader's own choice
    backend = chosen.name
    works, probe = gpu_jpeg_decode()
    decoder, decoder_why = resolve_decoder("auto", device)
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
        "gpu_bf16": bool(cuda and gpu_bf16()[0]),  # native (capability >= 8.0), what --amp auto asks
        "dali": HAS_DALI,
        "pillow": pillow_info(),
        "usable_cores": usable_cores(),
        "auto_backend": backend,
        "auto_backend_why": why,
        "gpu_jpeg_decode": works,
        "gpu_jpeg_decode_why": probe,
        # the nvjpeg backend's decoders on this device: [works, why], and the one `auto` picks
        "decoders": {n: list(decoders.probe(n, device)) for n in decoders.NAMES},
        "auto_decoder": decoder,
        "auto_decoder_why": decoder_why,
        # CUDA's (least, greatest) stream priority: the loader's streams take the least
        "stream_priorities": list(torch.cuda.Stream.priority_range()) if cuda else None,
        # what the other parts need besides torch (a missing one explains a failed part)
        "modules": {
            names[0]: dist_version(*names)
            for names in (
                ("numpy",),
                ("pillow", "pillow-simd"),
                ("tqdm",),
                ("pytest",),
                ("webdataset",),
                ("nvidia-nvimgcodec-cu13", "nvidia-nvimgcodec-cu12"),
                ("torchcodec",),
            )
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
    from stoker.tools.pack import pack

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
        from stoker.tools.common.synth import make_image_folder

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
    # the train part's setting and the fp32 baseline its speedups need first: the time box cuts the tail
    first = [("resnet50", "bf16", True, False), ("resnet50", "fp32", False, False)]
    combos = list(first)
    for compiled in (False, True):
        for m in ("resnet50", "inception"):
            for a in ("bf16", "fp16", "fp32"):
                for cl in (True, False):
                    if (m, a, cl, compiled) not in first:
                        combos.append((m, a, cl, compiled))
    return settings, combos


def part_bench_model(ctx: dict, save: Callable[[dict], None]) -> dict:
    if not ctx["cuda"] and not ctx["smoke"]:
        raise Skip("no CUDA device (model speed on the CPU is `stoker bench-model --device cpu`)")
    from ..model import add_speedups, bench_model

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


def _train_run(ctx: dict, run: Path, args: list, timeout: float) -> dict:
    """One ``stoker train`` run: its summary's telling keys."""
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
    proc = run_group(cmd, timeout=timeout)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"stoker train exited {proc.returncode}: {tail[:250]}")
    s = json.loads(proc.stdout[proc.stdout.index("{") :])
    keep = ("arch", "device", "amp", "epochs", "steps", "seconds", "images_per_s", "data_wait", "train_loss")
    return {"command": "stoker " + " ".join(cmd[3:]), **{k: s.get(k) for k in keep}}


def part_train(ctx: dict, save: Callable[[dict], None]) -> dict:
    """A short ``stoker train``, then (CUDA) the same with ``--compile``: images/s and data wait."""
    if not ctx.get("root"):
        raise Skip("no packed data (the data part did not finish)")
    if not ctx["cuda"] and not ctx["smoke"]:
        raise Skip("no CUDA device")
    out = Path(ctx["out"])
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
    result = _train_run(ctx, out / "train-run", args, time_left(ctx))
    save(result)
    if not ctx["cuda"]:  # inductor's C++ compile of a model takes minutes on a CPU: a smoke run skips it
        result["compiled"] = {"skipped": "torch.compile: CUDA only in this check"}
        return result
    try:  # its first steps compile (about a minute): what is left of the box, or a timeout recorded
        result["compiled"] = _train_run(ctx, out / "train-run-compiled", [*args, "--compile"], time_left(ctx))
    except TimeoutError as e:
        result["compiled"] = {"error": f"timed out: {e}"}
    except RuntimeError as e:
        result["compiled"] = {"error": str(e)}
    return result


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
