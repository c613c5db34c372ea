"""The GPU check: measure stoker on a CUDA machine in a few minutes; one JSON, one table.

Runs, each part in its own process with its own time box (a part that fails or runs out
of time is recorded, and the next one still runs):

  environment   versions, GPU, which Loader backend ``auto`` picks here and why
  pytest        ``pytest -m gpu`` over stoker's tests
  data          DATA packed with the default settings, --repeat times (a packed dataset is
                unpacked and repacked so; used as is with --repeat 1; without --data,
                generated images)
  loader        the Loader's nvjpeg vs pil backends, images/s at --batch-size, --crop
                (train augmentation, batches delivered to the GPU)
  bench-model   ResNet-50 and the inception net alone: fp32 / bf16 / fp16 (GradScaler) x
                channels_last x torch.compile (``stoker bench-model``'s measurement)
  train         a short ``stoker train --arch resnet50 --amp bf16 --channels-last`` with
                the fraction of step time spent waiting for data

and writes OUT/gpu_check.json and OUT/gpu_check.md (plus each part's log in OUT/logs/).
Without CUDA the GPU parts are skipped with the reason; --cpu-smoke runs them at
miniature size on the CPU instead (to test this script, not to measure anything).
Exit status 0 when every part ran or was skipped, 1 when one failed or ran out of time.

examples:
  python -m stoker.tools.gpu_check --data ../shared/data/imagenet-sample --out gpu-out
  python -m stoker.tools.gpu_check --data out/train --out gpu-out --parts environment,loader
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

from .errors import UsageError

HELP = "measure stoker on a GPU (nvjpeg vs pil loader, bench-model, a short train): JSON + markdown"

PARTS = ("environment", "pytest", "data", "loader", "bench-model", "train")
#: default time box of each part, seconds (all of them together stay within --budget)
LIMITS = {"environment": 60, "pytest": 150, "data": 120, "loader": 90, "bench-model": 200, "train": 150}
#: targets of issue 11, reported as met or not
TARGET_NVJPEG_VS_PIL = 3.0
TARGET_DATA_WAIT = 0.10


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", metavar="DIR",
                   help="images (a folder, or class subfolders) to pack, or a packed dataset/split "
                        "(repacked --repeat times; as is with --repeat 1) (default: generated images)")
    p.add_argument("--out", required=True, metavar="OUT", help="output folder (created)")
    p.add_argument("--parts", default=",".join(PARTS), help="comma-separated subset of: " + ",".join(PARTS))
    p.add_argument("--budget", type=float, default=480.0, metavar="S",
                   help="seconds for all parts together (default 480); each part also has its own box")
    p.add_argument("--limit", action="append", default=[], metavar="PART=S",
                   help="time box of one part in seconds (repeatable), e.g. --limit bench-model=300")
    p.add_argument("--batch-size", type=int, default=256, help="default 256")
    p.add_argument("--crop", type=int, default=224, help="default 224")
    p.add_argument("--repeat", type=int, default=4,
                   help="pack the images this many times, so an epoch outlasts the loader's start (default 4)")
    p.add_argument("--synthetic", type=int, default=600, metavar="N",
                   help="images generated when --data is not given (default 600)")
    p.add_argument("--loader-seconds", type=float, default=15.0, help="timed seconds per backend (default 15)")
    p.add_argument("--model-seconds", type=float, default=2.0,
                   help="timed seconds per bench-model setting (default 2)")
    p.add_argument("--train-epochs", type=int, default=3, help="epochs of the train part (default 3)")
    p.add_argument("--cpu-smoke", action="store_true",
                   help="without CUDA, run the GPU parts at miniature size on the CPU (tests this script)")


# ---------------------------------------------------------------------------- the parts (children)

class Skip(Exception):
    """A part that does not apply here; the message says why."""


def _time_left(ctx: dict) -> float:
    """Seconds this part has left, less a margin to write its record before the parent's box closes."""
    left = ctx["started"] + ctx["limit"] - min(5.0, 0.1 * ctx["limit"]) - time.time()
    if left <= 0:
        raise TimeoutError(f"no time left in its {ctx['limit']:.0f} s time box")
    return left


def _one_line(e: BaseException) -> str:
    return " ".join(f"{type(e).__name__}: {e}".split())[:300]


def part_environment(ctx: dict, save: Callable[[dict], None]) -> dict:
    import platform

    import torch

    from stoker.pipeline.deps import HAS_DALI, gpu_jpeg_decode, pillow_info, resolve_backend, usable_cores

    from .diagnose_measure import dist_version

    cuda = torch.cuda.is_available()
    backend, why = resolve_backend("auto", "cuda" if cuda else "cpu")
    works, probe = gpu_jpeg_decode()
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "python": sys.version.split()[0], "platform": platform.platform(),
        "torch": torch.__version__, "torchvision": dist_version("torchvision"),
        "cuda": cuda, "cuda_version": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(0) if cuda else None,
        "gpu_count": torch.cuda.device_count() if cuda else 0,
        "gpu_bf16": bool(cuda and torch.cuda.is_bf16_supported()),
        "dali": HAS_DALI, "pillow": pillow_info(), "usable_cores": usable_cores(),
        "auto_backend": backend, "auto_backend_why": why,
        "gpu_jpeg_decode": works, "gpu_jpeg_decode_why": probe,
        # what the other parts need besides torch (a missing one explains a failed part)
        "modules": {names[0]: dist_version(*names) for names in (
            ("numpy",), ("pillow", "pillow-simd"), ("tqdm",), ("pytest",), ("webdataset",))},
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
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider",
           "--continue-on-collection-errors", "tests"]
    proc = _run_group(cmd, timeout=_time_left(ctx), cwd=root)
    lines = proc.stdout.strip().splitlines()
    summary = next((ln.strip("= ") for ln in reversed(lines) if re.search(r"\d+ (passed|failed|skipped|error)", ln)),
                   lines[-1] if lines else "no output")
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", summary)}
    failures = [ln[len("FAILED "):][:200] for ln in lines if ln.startswith(("FAILED ", "ERROR "))]
    result = {"command": " ".join(cmd[1:]), "returncode": proc.returncode, "summary": summary,
              "passed": counts.get("passed", 0), "failed": counts.get("failed", 0),
              "skipped": counts.get("skipped", 0), "errors": counts.get("error", 0) + counts.get("errors", 0),
              "failures": failures}
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
        out += [(Path(dirpath) / f, cls) for f in sorted(filenames)
                if not f.startswith(".") and Path(f).suffix.lower() in exts]
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

    from .cli import run_command

    out = Path(ctx["out"])
    data = Path(ctx["data"]) if ctx["data"] else None
    packed = next((p for p in ([data, data / "train"] if data else []) if (p / MANIFEST_NAME).exists()), None)
    if packed is not None and ctx["repeat"] == 1:  # used as it is
        m = Manifest.load(packed)
        return {"split": str(packed), "root": str(packed.parent), "samples": m.num_samples, "packed_here": False,
                "source": str(data), "pack": m.pack}
    if packed is not None:
        check_shards(packed, Manifest.load(packed))  # a damaged shard is named here, not half-unpacked
        data = out / "unpacked"
        if not data.exists():
            _unpack(packed, data.with_name("unpacked.tmp"))
            os.replace(data.with_name("unpacked.tmp"), data)
    elif data is None:
        from .synth import make_image_folder

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
        run_command(["pack", str(src), str(root), "-q"])
    m = Manifest.load(root / "train")
    return {"split": str(root / "train"), "root": str(root), "samples": m.num_samples, "packed_here": True,
            "source": str(ctx["data"] or data), "images": len(files), "repeat": ctx["repeat"], "pack": m.pack}


def _measure_loader(ctx: dict, backend: str, device: str) -> dict:
    from stoker.pipeline import Loader

    from .peers.timing import epochs, timed

    loader = Loader(ctx["split"], batch_size=ctx["batch_size"], crop=ctx["crop"], backend=backend,
                    device=device, train=True)

    def epoch(e):
        loader.set_epoch(e)
        return iter(loader)

    r = timed(epochs(epoch, 10 ** 6), {"warmup": 3 if not ctx["smoke"] else 1, "seconds": ctx["loader_seconds"]})
    r.update({"backend": loader.backend, "device": device,
              "gpu_fallbacks": getattr(loader._runner, "gpu_fallbacks", None)})
    return r


def _nvjpeg_stages(ctx: dict, device: str, batches: int = 8) -> dict:
    """Where the nvjpeg backend's time goes, one synchronized stage at a time on one thread
    (no overlap, first batch not counted): reading bytes, decoding, cropping + resizing."""
    import torch

    from stoker.model.throughput import synchronize
    from stoker.pipeline import augment
    from stoker.pipeline.nvjpeg_backend import crop_resize, decode_jpegs
    from stoker.pipeline.shards.samples import open_split

    idx = open_split(ctx["split"])
    dev, B, c = torch.device(device), ctx["batch_size"], ctx["crop"]
    took = {"read": 0.0, "decode": 0.0, "crop_resize": 0.0}
    n = 0
    starts = range(0, len(idx.valid) - B + 1, B)
    for j, s in enumerate(list(starts)[:batches + 1]):
        ids = idx.valid[s:s + B]
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
    for backend in (("nvjpeg", "pil") if ctx["cuda"] else ("pil",)):
        try:
            result["rows"][backend] = _measure_loader(ctx, backend, device)
        except Exception as e:  # noqa: BLE001 - one backend failing must not lose the other
            result["rows"][backend] = {"error": _one_line(e)}
        save(result)
    if ctx["cuda"] or ctx["smoke"]:
        try:
            result["nvjpeg_stages"] = _nvjpeg_stages(ctx, device)
        except Exception as e:  # noqa: BLE001 - a diagnostic: its failure is recorded, not fatal
            result["nvjpeg_stages"] = {"error": _one_line(e)}
        save(result)
    nv, pil = (result["rows"][b].get("img_s") for b in ("nvjpeg", "pil"))
    result["nvjpeg_vs_pil"] = nv / pil if nv and pil else None
    if all("error" in r for r in result["rows"].values() if "skipped" not in r):
        raise RuntimeError("; ".join(f"{b}: {r['error']}" for b, r in result["rows"].items() if "error" in r))
    return result


def _model_plan(ctx: dict) -> tuple[dict, list]:
    """bench-model settings, the most telling first (the time box may cut the tail)."""
    if not ctx["cuda"]:
        return ({"batch_size": 2, "image_size": 32, "seconds": 0.05, "steps_min": 1, "warmup_steps": 1},
                [("resnet18", "fp32", False, False), ("resnet18", "fp32", True, False)])
    settings = {"batch_size": ctx["batch_size"], "image_size": ctx["crop"], "seconds": ctx["model_seconds"],
                "steps_min": 5, "warmup_steps": 3}
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
    from .bench_model import run_bench

    settings, combos = _model_plan(ctx)
    deadline = time.monotonic() + _time_left(ctx)
    result: dict[str, Any] = {**settings, "rows": [], "not_run": []}
    slowest = 0.0
    for m, a, cl, co in combos:
        # a compiled setting costs a compile: leave it out when it cannot finish in time
        need = max(slowest, 60.0 if co else 5.0) if ctx["cuda"] else 0.0
        if time.monotonic() + need > deadline:
            result["not_run"].append({"model": m, "amp": a, "channels_last": cl, "compile": co})
            continue
        t = time.monotonic()
        res = run_bench(models=[m], device="cuda" if ctx["cuda"] else "cpu", amps=[a],
                        channels_last="on" if cl else "off", compile="on" if co else "off", progress=False,
                        **settings)
        slowest = max(slowest, time.monotonic() - t) if co else slowest
        result.update({"device_name": res["device_name"], "torch": res["torch"]})
        result["rows"] += res["rows"]
        save(result)
    if not result["rows"]:
        raise TimeoutError(f"no setting fits in the {ctx['limit']:.0f} s time box")
    for r in result["rows"]:  # vs the same model's plain fp32 row
        base = next((b for b in result["rows"] if b["model"] == r["model"] and b["amp"] == "fp32"
                     and not b["channels_last"] and not b["compile"] and "images_per_s" in b), None)
        r["speedup"] = r["images_per_s"] / base["images_per_s"] if base and "images_per_s" in r else None
    return result


def part_train(ctx: dict, save: Callable[[dict], None]) -> dict:
    if not ctx.get("root"):
        raise Skip("no packed data (the data part did not finish)")
    if not ctx["cuda"] and not ctx["smoke"]:
        raise Skip("no CUDA device")
    run = Path(ctx["out"]) / "train-run"
    if ctx["cuda"]:
        args = ["--arch", "resnet50", "--epochs", str(ctx["train_epochs"]), "--batch-size", str(ctx["batch_size"]),
                "--crop", str(ctx["crop"]), "--amp", "bf16", "--channels-last", "--device", "cuda", "--log-every", "5"]
    else:
        args = ["--arch", "resnet18", "--epochs", "1", "--batch-size", "4", "--crop", "32", "--amp", "off",
                "--device", "cpu", "--log-every", "2", "--threads", "1"]
    cmd = [sys.executable, "-m", "stoker.tools.cli", "train", ctx["root"], "--out", str(run), *args,
           "--json", "--no-progress"]
    proc = _run_group(cmd, timeout=_time_left(ctx))
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"stoker train exited {proc.returncode}: {tail[:250]}")
    s = json.loads(proc.stdout[proc.stdout.index("{"):])
    keep = ("arch", "device", "amp", "epochs", "steps", "seconds", "images_per_s", "data_wait", "train_loss")
    return {"command": "stoker " + " ".join(cmd[3:]), **{k: s.get(k) for k in keep}}


_PART_FUNCS = {"environment": part_environment, "pytest": part_pytest, "data": part_data, "loader": part_loader,
               "bench-model": part_bench_model, "train": part_train}


def _run_group(cmd: list, *, timeout: float, cwd=None) -> subprocess.CompletedProcess:
    """``subprocess.run`` in its own process group, killed as a whole on timeout."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        raise TimeoutError(f"`{' '.join(map(str, cmd[:6]))} ...` ran past {timeout:.0f} s") from None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.communicate()


def _write_json(path: Path, obj: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=str))
    os.replace(tmp, path)  # a reader never sees half a file


def _child() -> None:
    """Entry point of one part's process: writes its record (status, result) as it goes."""
    name, ctx = sys.argv[1], json.loads(sys.argv[2])
    path = Path(ctx["record"])
    last: dict = {}

    def save(result: dict) -> None:
        last.clear()
        last.update(result)
        _write_json(path, {"status": "running", "result": result})

    try:
        result = _PART_FUNCS[name](ctx, save)
    except Skip as e:
        _write_json(path, {"status": "skipped", "why": str(e)})
        return
    except TimeoutError as e:  # the part's own time box (a subprocess it ran, settings left out)
        _write_json(path, {"status": "timeout", "error": _one_line(e), "result": dict(last) or None})
        sys.exit(1)
    except BaseException as e:  # noqa: BLE001 - recorded; the traceback goes to the part's log
        import traceback

        traceback.print_exc()
        _write_json(path, {"status": "failed", "error": _one_line(e), "result": dict(last) or None})
        sys.exit(1)
    _write_json(path, {"status": "ok", "result": result})


# ---------------------------------------------------------------------------- the parent

def _run_part(name: str, ctx: dict, limit: float, out: Path) -> dict:
    """Run one part in a child process within ``limit`` seconds; its record, never raising."""
    record = out / "parts" / f"{name}.json"
    record.unlink(missing_ok=True)
    log = out / "logs" / f"{name}.log"
    ctx = {**ctx, "record": str(record), "limit": limit, "started": time.time()}
    t = time.monotonic()
    cmd = [sys.executable, "-c", "from stoker.tools.gpu_check import _child; _child()", name, json.dumps(ctx)]
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=limit)
            timed_out = False
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            timed_out = True
    seconds = time.monotonic() - t
    try:
        rec = json.loads(record.read_text())
    except (OSError, ValueError):
        rec = {"status": "failed", "result": None}
    if timed_out:
        rec = {"status": "timeout", "error": f"ran past its {limit:.0f} s time box (partial results kept)",
               "result": rec.get("result")}
    elif rec["status"] == "running" or (proc.returncode and rec["status"] not in ("failed", "timeout")):
        lines = log.read_text(errors="replace").strip().splitlines()
        rec = {"status": "failed", "result": rec.get("result"),
               "error": f"exited {proc.returncode}: " + (lines[-1][:250] if lines else "no output")}
    rec["seconds"] = round(seconds, 1)
    rec["log"] = str(log)
    return rec


def _limits(args) -> dict:
    limits = dict(LIMITS)
    for item in args.limit:
        name, sep, value = item.partition("=")
        if not sep or name not in LIMITS:
            raise UsageError(f"--limit {item!r}: expected PART=SECONDS with PART one of {', '.join(PARTS)}")
        try:
            limits[name] = float(value)
        except ValueError:
            raise UsageError(f"--limit {item!r}: {value!r} is not a number of seconds") from None
        if limits[name] <= 0:
            raise UsageError(f"--limit {item!r}: must be > 0 seconds")
    return limits


def run_check(args) -> dict:
    """Run the requested parts, write OUT/gpu_check.json and OUT/gpu_check.md; the result."""
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown or not parts:
        raise UsageError(f"--parts: unknown part(s) {unknown}; choose from {', '.join(PARTS)}")
    for name in ("batch_size", "crop", "repeat", "synthetic", "train_epochs"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1")
    if args.budget <= 0 or args.loader_seconds <= 0 or args.model_seconds <= 0:
        raise UsageError("--budget, --loader-seconds and --model-seconds must be > 0")
    if args.data and not Path(args.data).is_dir():
        raise UsageError(f"--data {args.data} is not a folder")
    limits = _limits(args)
    out = Path(args.out)
    for sub in ("parts", "logs"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    for name in ("gpu_check.json", "gpu_check.md"):  # never leave an old report beside a new run
        (out / name).unlink(missing_ok=True)
    ctx = {"out": str(out.resolve()), "data": str(Path(args.data).resolve()) if args.data else None,
           "batch_size": args.batch_size, "crop": args.crop, "repeat": args.repeat, "synthetic": args.synthetic,
           "loader_seconds": args.loader_seconds, "model_seconds": args.model_seconds,
           "train_epochs": args.train_epochs, "cuda": False, "smoke": False, "split": None, "root": None}
    t0 = time.monotonic()
    records: dict[str, dict] = {}
    env = _run_part("environment", ctx, min(limits["environment"], args.budget), out)
    records["environment"] = env
    ctx["cuda"] = bool((env.get("result") or {}).get("cuda"))
    ctx["smoke"] = not ctx["cuda"] and args.cpu_smoke
    if ctx["smoke"]:  # miniature sizes: this exercises the script, it measures nothing
        ctx.update(batch_size=min(args.batch_size, 4), crop=min(args.crop, 32),
                   loader_seconds=min(args.loader_seconds, 1.0))
    for name in PARTS[1:]:
        if name not in parts and not (name == "data" and {"loader", "train"} & set(parts)):
            continue
        left = args.budget - (time.monotonic() - t0)
        if left < 5:
            records[name] = {"status": "timeout", "error": f"not started: the {args.budget:.0f} s budget was spent",
                             "seconds": 0.0}
            continue
        rec = records[name] = _run_part(name, ctx, min(limits[name], left), out)
        if name == "data" and rec["status"] == "ok":
            ctx["split"], ctx["root"] = rec["result"]["split"], rec["result"]["root"]
    result = {"tool": "stoker gpu_check", "settings": {k: ctx[k] for k in (
        "data", "batch_size", "crop", "repeat", "loader_seconds", "model_seconds", "train_epochs", "smoke")},
        "budget_s": args.budget, "seconds": round(time.monotonic() - t0, 1), "parts": records}
    result["targets"] = _targets(result)
    _write_json(out / "gpu_check.json", result)
    (out / "gpu_check.md").write_text(format_markdown(result))
    return result


def _targets(result: dict) -> dict:
    parts = result["parts"]
    ratio = ((parts.get("loader") or {}).get("result") or {}).get("nvjpeg_vs_pil")
    wait = ((parts.get("train") or {}).get("result") or {}).get("data_wait")
    smoke = result["settings"]["smoke"]
    return {
        "nvjpeg_vs_pil": {"target": f">= {TARGET_NVJPEG_VS_PIL:g}x", "measured": ratio,
                          "met": None if ratio is None or smoke else ratio >= TARGET_NVJPEG_VS_PIL},
        "train_data_wait": {"target": f"< {TARGET_DATA_WAIT:.0%}", "measured": wait,
                            "met": None if wait is None or smoke else wait < TARGET_DATA_WAIT},
    }


def _fmt(x: Optional[float], spec: str = "{:,.0f}") -> str:
    return "-" if x is None else spec.format(x)


def format_markdown(result: dict) -> str:
    """The report as markdown: environment, part status, loader, model, train, tests, targets."""
    parts = result["parts"]
    env = (parts.get("environment") or {}).get("result") or {}
    smoke = result["settings"]["smoke"]
    lines = [f"# stoker GPU check, {env.get('date', '?')}: {env.get('gpu') or 'no GPU'}", ""]
    if smoke:
        lines += ["**CPU smoke run: miniature sizes, no figure here means anything.**", ""]
    lines.append(f"torch {env.get('torch', '?')}, torchvision {env.get('torchvision', '?')}, CUDA "
                 f"{env.get('cuda_version') or '-'}, DALI {'installed' if env.get('dali') else 'not installed'}, "
                 f"{env.get('usable_cores', '?')} CPU cores; Loader backend `auto` here: "
                 f"**{env.get('auto_backend', '?')}** ({env.get('auto_backend_why', '?')})")
    missing = [m for m, v in (env.get("modules") or {}).items() if v is None]
    if missing:
        lines.append(f"\nnot installed here: {', '.join(missing)}")
    lines += ["", "| part | status | seconds | note |", "|---|---|---:|---|"]
    for name, rec in parts.items():
        note = rec.get("why") or rec.get("error") or ""
        lines.append(f"| {name} | {rec['status']} | {rec.get('seconds', 0):.0f} | {note.replace('|', '/')} |")
    ld = (parts.get("loader") or {}).get("result")
    if ld:
        lines += ["", f"## Loader: batch {ld['batch_size']}, crop {ld['crop']}, train augmentation, "
                      f"batches on {ld['device']}", "",
                  "| backend | images/s | vs pil | CPU % | GPU fallbacks | note |", "|---|---:|---:|---:|---:|---|"]
        pil = (ld["rows"].get("pil") or {}).get("img_s")
        for b, r in ld["rows"].items():
            note = r.get("skipped") or r.get("error") or ""
            ratio = _fmt(r["img_s"] / pil, "{:.2f}x") if r.get("img_s") and pil else "-"
            lines.append(f"| {b} | {_fmt(r.get('img_s'))} | {ratio} | {_fmt(r.get('cpu_pct'))} | "
                         f"{_fmt(r.get('gpu_fallbacks'), '{}')} | {note.replace('|', '/')} |")
        st = ld.get("nvjpeg_stages")
        if st and "error" in st:
            lines.append(f"\nnvjpeg stages: failed: {st['error']}")
        elif st:
            lines.append(f"\nnvjpeg stages, one at a time, synchronized, one thread ({st['batches']} batches on "
                         f"{st['device']}): read {_fmt(st['read_img_s'])} img/s, decode {_fmt(st['decode_img_s'])} "
                         f"img/s, crop + resize + flip {_fmt(st['crop_resize_img_s'])} img/s")
    bm = (parts.get("bench-model") or {}).get("result")
    if bm:
        lines += ["", f"## Model alone (`stoker bench-model`): batch {bm['batch_size']} x {bm['image_size']}px "
                      "synthetic uint8, forward + backward + SGD step", "",
                  "| model | amp | channels_last | compile | images/s | ms/step | vs fp32 |",
                  "|---|---|---|---|---:|---:|---:|"]
        for r in bm["rows"]:
            head = f"| {r['model']} | {r['amp']} | {'yes' if r['channels_last'] else 'no'} | " \
                   f"{'yes' if r['compile'] else 'no'} |"
            if "error" in r:
                lines.append(f"{head} failed: {r['error'][:100].replace('|', '/')} | | |")
            else:
                lines.append(f"{head} {_fmt(r['images_per_s'])} | {r['step_ms']:.1f} | "
                             f"{_fmt(r.get('speedup'), '{:.2f}x')} |")
        if bm["not_run"]:
            lines.append(f"\nnot run (time box): {len(bm['not_run'])} setting(s): " + ", ".join(
                f"{r['model']} {r['amp']}{' cl' if r['channels_last'] else ''}{' compile' if r['compile'] else ''}"
                for r in bm["not_run"]))
    tr = (parts.get("train") or {}).get("result")
    if tr:
        lines += ["", "## Training", "", f"`{tr['command']}`", "",
                  f"{tr['steps']} steps in {tr['seconds']:.0f} s: {_fmt(tr['images_per_s'])} images/s, "
                  f"data wait {_fmt(tr['data_wait'] and 100 * tr['data_wait'], '{:.1f}')}% of step time "
                  "(first log window excluded)"]
    pt = (parts.get("pytest") or {}).get("result")
    if pt:
        lines += ["", "## pytest -m gpu", "", pt["summary"]]
        lines += [f"- FAILED {f}" for f in pt["failures"]]
    lines += ["", "## Targets", ""]
    for key, label in (("nvjpeg_vs_pil", "nvjpeg vs pil images/s"), ("train_data_wait", "ResNet-50 bf16 data wait")):
        t = result["targets"][key]
        got = "-" if t["measured"] is None else (f"{t['measured']:.2f}x" if key == "nvjpeg_vs_pil"
                                                 else f"{100 * t['measured']:.1f}%")
        met = {True: "met", False: "NOT met", None: "not judged (CPU smoke run)" if smoke else "not measured"}[
            t["met"]]
        lines.append(f"- {label}: target {t['target']}, measured {got}: {met}")
    return "\n".join(lines) + "\n"


def main(args: argparse.Namespace) -> int:
    result = run_check(args)
    print(format_markdown(result))
    print(f"wrote {Path(args.out) / 'gpu_check.json'} and {Path(args.out) / 'gpu_check.md'}", file=sys.stderr)
    return 0 if all(r["status"] in ("ok", "skipped") for r in result["parts"].values()) else 1


def _cli(argv: Optional[list] = None) -> int:
    from stoker import StokerError

    p = argparse.ArgumentParser(prog="python -m stoker.tools.gpu_check", description=__doc__.strip(),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    args = p.parse_args(argv)
    try:
        return main(args)
    except StokerError as e:
        print(f"gpu_check: {'error: ' if e.exit_code == 2 else ''}{e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("gpu_check: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(_cli())
