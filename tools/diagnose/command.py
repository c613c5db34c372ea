"""Tell why training is slow, with numbers: loader-bound, model-bound or transfer-bound.

Measures, in one run: the loader alone; the model alone (forward+backward+step on a
synthetic batch already on the device) in fp32, with AMP and with channels_last where
they apply; the two together end to end, with the fraction of time spent waiting for
data; the bytes each batch sends to the device (uint8 vs float32); and a parameter/FLOP
audit of the model that flags a layer holding most of the parameters. Then a verdict
with the ratio behind it, and the next steps ranked by the speed-up they would bring,
each with the command or code change.

How long: each figure takes at least --seconds and 5 steps (batches), at most 3x
--seconds, and is timed in windows whose spread it reports (±). A figure that got fewer
than 5 steps, or whose windows spread more than ±25%, is too few or too noisy to advise
on: the report says so and ranks no speed-up that rests on it. The loader, fp32 and
end-to-end figures are always measured; the model's variants (AMP, channels_last, 2x
batch) only while the run stays within 12x --seconds. With the defaults a run takes
about a minute (60 s for the default inception at batch 64 on 2 CPU cores), plus packing
a sample for an ImageFolder. A model slower than 3 s a step (resnet50 at batch 64 on a
CPU) takes longer and gets fewer than 5 steps a figure: once its first step is timed, one
line says how long the run takes and the --seconds that settles its figures (or lower
--batch-size).

--amp auto measures what `stoker train --amp auto` trains with: bf16 on GPUs that have
it, fp16 on the others, bf16 on CPUs with native bf16 (AMX/AVX512-BF16), nothing on
other CPUs (--amp bf16 measures it there anyway).

DATA is stoker shards (a split folder with stoker.json, or a `stoker pack` OUT with
train/) or an ImageFolder (or a tree with train/ and val/ ImageFolders); for an
ImageFolder it measures the torchvision pipeline you have now, and what `stoker pack`
would give (a small subset is packed into a temporary folder and measured).

examples:
  stoker diagnose out/ --arch resnet50 --batch-size 128
  stoker diagnose ~/data/imagenet --model my_project.nets:build --seconds 10
  stoker diagnose out/train --model train.py:make_net --json > diagnosis.json
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from stoker.errors import DiagnoseError, UsageError

from ..common.loader_flags import add_crop_flags, add_decode_flags, add_pixel_flags, add_storage_flags, crop_spec
from .engine import run_diagnosis, time_plan
from .inputs import (
    backend_choice,
    bucket_hint,
    build_net,
    count_data,
    describe_loader,
    loader_hints,
    pack_sample,
    pack_source,
    resolve_data,
    resolve_device,
    stoker_loader,
)
from .text import format_report

__all__ = ["diagnose", "Diagnosis", "run_diagnosis", "format_report", "DiagnoseError"]

HELP = "measure loader, model, transfer and end to end; say what bounds training and what to change"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "data",
        metavar="DATA",
        help="stoker shards (split folder or `stoker pack` OUT, local or a URL) or an ImageFolder",
    )
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--arch",
        default="inception",
        help="stoker network ('inception'; 'report': the report's original network, one regressed "
        "output) or a torchvision model name (default inception)",
    )
    g.add_argument(
        "--model",
        metavar="MODULE:FACTORY",
        help="your network: 'package.module:factory' or 'path/to/file.py:factory'; FACTORY() (given "
        "num_classes= when it takes it) returns an nn.Module taking normalized float NCHW input",
    )
    p.add_argument("-b", "--batch-size", type=int, default=64, help="batch size (default 64)")
    add_crop_flags(p)
    p.add_argument("--device", default=None, help="cuda, cuda:1 or cpu (default: cuda when available)")
    p.add_argument(
        "--seconds",
        type=float,
        default=5.0,
        help="least time of each measurement; each also takes at least 5 steps, at most 3x this; "
        "the whole run about 12x this (default 5: about a minute)",
    )
    p.add_argument(
        "--amp",
        choices=("auto", "bf16", "fp16", "off"),
        default="auto",
        help="autocast to measure (auto: what `stoker train --amp auto` uses: bf16 where native, fp16 on "
        "GPUs without bf16; skipped on CPUs without native bf16)",
    )
    p.add_argument(
        "--channels-last",
        choices=("auto", "on", "off"),
        default="auto",
        help="measure channels_last (auto: when the model has convolutions)",
    )
    add_decode_flags(p, workers=False)  # its --workers: the torchvision pipeline's DataLoader
    add_pixel_flags(p)
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        help="DataLoader workers of the torchvision pipeline for an ImageFolder (default: CPU count)",
    )
    p.add_argument(
        "--pack-sample",
        type=int,
        default=256,
        metavar="N",
        help="ImageFolder: images packed into a temporary folder to measure stoker (default 256; 0 skips)",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON (every figure) on stdout")
    add_storage_flags(p, cache=False, order=False)


@dataclasses.dataclass
class Diagnosis:
    """What :func:`diagnose` measured and concluded.

    Attributes:
        report: The JSON-ready report (``stoker diagnose --json``): ``environment``,
            ``settings``, ``data``, ``loader``, ``loader_alternatives``, ``model``,
            ``end_to_end``, ``transfer``, ``audit``, ``verdict``, ``next_steps``, ``not_helping``.
    """

    report: dict

    @property
    def verdict(self) -> dict:
        """``bound``, ``label``, ``ratio``, ``stages``, ``data_wait_fraction``, ``text``, ..."""
        return self.report["verdict"]

    @property
    def bound(self) -> str:
        """The stage that bounds training: ``"loader"``, ``"model"`` or ``"transfer"``."""
        return self.report["verdict"]["bound"]

    @property
    def next_steps(self) -> list:
        """The changes that would speed training up, best first (``id``, ``title``, ``action``, ``est_speedup``)."""
        return self.report["next_steps"]

    def to_dict(self) -> dict:
        """The JSON-ready report."""
        return self.report

    def format(self) -> str:
        """The human report ``stoker diagnose`` prints."""
        return format_report(self.report)


def _check_settings(batch_size: int, crop, seconds: float, threads: int | None):
    """The crop recipe (a ``CropSpec`` from a side, ``(height, width)`` or a ``CropSpec``), once the
    scalar settings are checked; each bad value a one-line UsageError."""
    from stoker.pipeline.augment import CropSpec

    if batch_size < 1:
        raise UsageError(f"--batch-size {batch_size} must be >= 1")
    if seconds <= 0:
        raise UsageError(f"--seconds {seconds} must be > 0")
    if threads is not None and threads < 1:
        raise UsageError(f"--threads {threads} must be >= 1")
    try:
        return crop if isinstance(crop, CropSpec) else CropSpec.of(crop)
    except ValueError as e:
        raise UsageError(f"--crop: {e}") from None


def diagnose(
    data: str | Path,
    *,
    storage_options: dict | None = None,
    arch: str = "inception",
    model=None,
    batch_size: int = 64,
    crop=224,
    device: str | None = None,
    seconds: float = 5.0,
    amp: str = "auto",
    channels_last: str = "auto",
    backend: str = "auto",
    decoder: str = "auto",
    decode: str = "auto",
    threads: int | None = None,
    workers: int | None = None,
    pack_sample_size: int = 256,
    pixel_cache=None,
    progress: Callable[[str], None] | None = None,
) -> Diagnosis:
    """Measure why training on ``data`` is slow: loader, model, transfer, end to end.

    Args:
        data: stoker shards (a split folder, or a `stoker pack` OUT with train/) or an ImageFolder
            or a tree of train/ and val/ ImageFolders (then the torchvision pipeline is measured
            on the train images, and stoker on a packed sample of them). Shards
            may be at a URL: fetched whole into the shard cache first.
        storage_options: fsspec options for a URL ``data`` (credentials, ``endpoint_url``).
        arch: stoker network (``"inception"``, ``"report"``) or a torchvision model name.
        model: Your network instead of ``arch``: an ``nn.Module`` taking normalized float NCHW
            input, or ``"package.module:factory"`` / ``"path/to/file.py:factory"``.
        batch_size: Batch size of the loader and the model.
        crop: What the loader produces: a side, ``(height, width)``, or the whole recipe (a
            :class:`~stoker.pipeline.augment.CropSpec`, its train crop's scale and ratio too).
        device: ``"cuda"``, ``"cuda:1"`` or ``"cpu"`` (None: cuda when available).
        seconds: Least time of each measurement (each also takes at least 5 steps, at most 3x
            ``seconds``; the model's variants are measured while the run stays within 12x).
        amp: Autocast to measure: ``"auto"`` (what ``stoker train --amp auto`` uses), ``"bf16"``,
            ``"fp16"`` or ``"off"``.
        channels_last: ``"auto"`` (when the model has convolutions), ``"on"`` or ``"off"``.
        backend: stoker Loader backend (``"auto"`` or a name of :func:`stoker.pipeline.backends.backend_names`).
        decoder: the nvjpeg backend's GPU JPEG decoder (``"auto"``: the Loader's own choice).
        decode: stoker Loader decode (``"auto"``, ``"mixed"``, ``"cpu"``).
        threads: stoker Loader threads (None: its own default).
        workers: DataLoader workers of the torchvision pipeline (None: the usable cores).
        pack_sample_size: ImageFolder: images packed into a temporary folder to measure stoker (0 skips).
        pixel_cache: the stoker Loader's decoded-pixel tier (a folder or a
            :class:`~stoker.pipeline.pixels.PixelCache`): the loader is measured as it runs, samples
            its store holds cropped from pixels, the others decoded into it (a second run, or one
            after a training epoch, measures the warm tier).
        progress: Called with a line before each measurement.

    Returns:
        The :class:`Diagnosis`.

    Raises:
        UsageError: Bad data, setting or model; or the model does not train at this batch size.
    """
    from stoker.pipeline.deps import usable_cores
    from stoker.pipeline.options import backend_for

    crops = _check_settings(batch_size, crop, seconds, threads)
    crop = crops.size[0] if crops.size[0] == crops.size[1] else crops.size  # for the model: a side or (h, w)
    kind, path = resolve_data(data, storage_options)
    device = resolve_device(device)
    chosen = backend_choice(backend, device, decoder)
    say = progress or (lambda line: None)
    cores = usable_cores()
    # Cheap facts first, then the user's model (a bad --model fails before any loader starts).
    num_classes, num_samples, task = count_data(kind, path)
    if num_samples < batch_size:
        raise UsageError(f"--batch-size {batch_size} is larger than the {num_samples} samples in {path}")
    net = build_net(arch, model, num_classes, crop, task)  # a bad --model is its one line, no plan before it
    started = time.perf_counter()  # the plan's time counts from here (a slow model's line says the real one)
    say(time_plan(seconds, packed_sample=min(pack_sample_size, num_samples) if kind != "shards" else 0))
    fit = _fit_batch(net, batch_size, crop=crop, device=device, task=task, seconds=seconds)
    if fit.why:
        say(fit.why)
        batch_size = fit.batch
    loader_kw = dict(
        batch_size=batch_size,
        train=True,
        crop=crops,
        device=device,
        seed=0,
        backend=backend_for(backend, decode=decode, decoder=decoder),
        threads=threads,
    )
    if pixel_cache is not None:
        loader_kw["pixel_cache"] = pixel_cache
    facts = {
        "kind": "stoker shards" if kind == "shards" else "ImageFolder",
        "path": str(path),
        "samples": num_samples,
        "classes": num_classes,
        "task": task.name if task is not None else "classify",
    }
    with contextlib.ExitStack() as cleanup:  # removes the packed sample's folder, however the run ends
        if kind == "shards":
            loader, more, alternatives = _shard_loaders(
                path, loader_kw, chosen=chosen, crop=crop, threads=threads, cores=cores
            )
        else:
            workers = workers if workers is not None else cores
            loader, more = _torchvision_loader(
                path, batch_size, chosen=chosen, crop=crop, workers=workers, device=device
            )
            n = min(pack_sample_size, num_samples)
            alternatives = [] if n <= 0 else [_packed_sample(data, path, n, loader_kw, crop, say, cleanup)]
        try:
            rep = run_diagnosis(
                loader,
                net,
                batch_size=batch_size,
                crop=crop,
                device=device,
                seconds=seconds,
                amp=amp,
                channels_last=channels_last,
                data=facts | more,
                alternatives=alternatives,
                progress=say,
                task=task,
                fit=fit,
                started=started,
            )
        except DiagnoseError as e:
            raise UsageError(str(e)) from None
    rep["settings"]["model"] = (
        model if isinstance(model, str) and model else (type(model).__name__ if model is not None else arch)
    )
    return Diagnosis(rep)


def _fit_batch(net, batch_size: int, *, crop, device: str, task, seconds: float):
    """The :class:`~stoker.tools.diagnose.sizing.BatchFit` of ``batch_size``: never OOM-killed, the
    batch that fits this machine's memory (and the run's time), said in one line."""
    from . import sizing
    from .timing import CAP, MIN_STEPS

    # a step may take what lets a figure's MIN_STEPS fit its time (at least STEP_FLOOR_S, so a busy
    # machine does not shrink a small model's batch)
    step_limit = max(CAP * seconds / MIN_STEPS, sizing.STEP_FLOOR_S)
    return sizing.fit_batch(net, batch_size, crop=crop, device=device, task=task, step_limit_s=step_limit)


def _shard_loaders(path: Path, loader_kw: dict, *, chosen: str, crop, threads: int | None, cores: int):
    """``(loader, facts, alternatives)`` for stoker shards: the Loader as asked, what the report
    says of it, and the Loaders that would load faster (more threads, GPU decoding)."""
    from stoker.pipeline.shards.manifest import Manifest

    loader = stoker_loader(path, **loader_kw)
    manifest = Manifest.load(path)
    facts = {
        "pack": manifest.pack,
        "loader": describe_loader(loader),
        "backend": chosen,
        "loader_hints": loader_hints(manifest, crop),
    }
    buckets = bucket_hint(path, crop)
    if buckets is not None:
        facts["buckets"] = buckets
    alternatives = []
    if threads is not None and threads < cores:
        alternatives.append(
            {
                "id": "threads",
                "label": f"{cores} threads",
                "title": f"Loader threads {cores} (from {threads})",
                "action": f"Loader(..., threads={cores})",
                "loader": stoker_loader(path, **{**loader_kw, "threads": cores}),
            }
        )
    if loader_kw["device"].startswith("cuda") and loader_kw["backend"].decode == "cpu":
        mixed = dataclasses.replace(loader_kw["backend"], decode="mixed")
        alternatives.append(
            {
                "id": "decode_mixed",
                "label": 'decode="mixed"',
                "title": 'Decode on the GPU (decode="mixed")',
                "action": f'Loader(..., backend={type(mixed).__name__}(decode="mixed"))',
                "loader": stoker_loader(path, **{**loader_kw, "backend": mixed}),
            }
        )
    return loader, facts, alternatives


def _torchvision_loader(path: Path, batch_size: int, *, chosen: str, crop, workers: int, device: str):
    """``(loader, facts)``: the torchvision pipeline an ImageFolder is trained with now."""
    from ..bench.runners import torchvision_loader

    loader, _ = torchvision_loader(
        path, batch_size=batch_size, crop=crop, workers=workers, pin_memory=device.startswith("cuda")
    )
    return loader, {
        "backend": chosen,
        "loader": "torchvision ImageFolder + RandomResizedCrop/flip/ToTensor/Normalize, "
        f"DataLoader(num_workers={workers}): float32 batches on the host",
    }


def _packed_sample(
    data: str | Path, path: Path, n: int, loader_kw: dict, crop, say: Callable[[str], None], cleanup
) -> dict:
    """The "after stoker pack" alternative: ``n`` images of the ImageFolder ``path`` packed into a
    temporary folder (removed when ``cleanup``, an ExitStack, closes) and stoker's Loader on them."""
    from stoker.pipeline.shards.manifest import Manifest

    say(f"packing {n} images into a temporary folder to measure stoker on them")
    tmp = Path(tempfile.mkdtemp(prefix="stoker-diagnose-"))
    cleanup.callback(shutil.rmtree, tmp, ignore_errors=True)
    split = pack_sample(path, n, tmp)
    batch_size, device = loader_kw["batch_size"], loader_kw["device"]
    packed_batch = min(batch_size, Manifest.load(split).num_samples)
    return {
        "id": "pack",
        "label": "after stoker pack",
        "title": "Pack with stoker pack, load with stoker's Loader",
        "action": f"stoker pack {pack_source(data, path)} OUT; then Loader('OUT/train', "
        f"batch_size={batch_size}, "
        f"crop={crop}, device={device!r})",
        "loader": stoker_loader(split, **{**loader_kw, "batch_size": packed_batch}),
        "basis_note": f"on {n} of the images, packed with defaults",
    }


def main(args: argparse.Namespace) -> int:
    from stoker.pipeline.storage import parse_storage_options

    from ..common.loader_flags import pixel_cache

    try:
        crops = crop_spec(args)
    except ValueError as e:
        raise UsageError(f"--crop: {e}") from None
    result = diagnose(
        args.data,
        storage_options=parse_storage_options(args.storage_option) or None,
        arch=args.arch,
        model=args.model,
        batch_size=args.batch_size,
        crop=crops,
        device=args.device,
        seconds=args.seconds,
        amp=args.amp,
        channels_last=args.channels_last,
        backend=args.backend,
        decoder=args.decoder,
        decode=args.decode,
        threads=args.threads,
        workers=args.workers,
        pixel_cache=pixel_cache(args),
        pack_sample_size=args.pack_sample,
        progress=lambda line: print(f"stoker diagnose: {line}", file=sys.stderr, flush=True),
    )
    print(json.dumps(result.to_dict(), indent=2, default=str) if args.json else result.format())
    return 0
