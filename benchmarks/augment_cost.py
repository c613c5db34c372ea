"""What per-sample batch augmentation costs: stoker's batched ops against torchvision.transforms.v2
applied image by image in a Python loop (the way a per-sample pipeline pays for it).

For each op at a fixed magnitude (bin 9 of 31, RandAugment's default), and for the whole policies,
the time per batch of ``--batch`` uint8 images of ``--size`` pixels on ``--device``: ours (one call
on the batch, each sample its own parameters) and torchvision's (one call per image), best of
``--repeats`` after a warm-up. Prints a markdown table (op, ours ms/batch, torchvision ms/batch,
ratio = torchvision / ours) with the torch version and the machine, or JSON with ``--json``.

    python -m stoker.benchmarks.augment_cost --repeats 2
    python -m stoker.benchmarks.augment_cost --device cuda --batch 256 --size 224 --json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time
from collections.abc import Callable

import numpy as np
import torch
import torchvision
from torchvision.transforms import v2
from torchvision.transforms.v2 import InterpolationMode
from torchvision.transforms.v2 import functional as F

from stoker.pipeline.augment import erasing, jitter, ops, policies
from stoker.pipeline.augment.mixing import Mixing

NEAREST = InterpolationMode.NEAREST
BIN = 9  # of 31


def _tv_op(name: str, m: float) -> Callable[[torch.Tensor], torch.Tensor]:
    """torchvision's per-image op, as its RandAugment applies ``name`` at magnitude ``m``."""
    geo = dict(interpolation=NEAREST, scale=1.0, angle=0.0)
    shear = math.degrees(math.atan(m))
    return {
        "ShearX": lambda im: F.affine(im, translate=[0, 0], shear=[shear, 0.0], center=[0, 0], **geo),
        "ShearY": lambda im: F.affine(im, translate=[0, 0], shear=[0.0, shear], center=[0, 0], **geo),
        "TranslateX": lambda im: F.affine(im, translate=[int(m), 0], shear=[0.0, 0.0], **geo),
        "TranslateY": lambda im: F.affine(im, translate=[0, int(m)], shear=[0.0, 0.0], **geo),
        "Rotate": lambda im: F.rotate(im, m, interpolation=NEAREST),
        "Brightness": lambda im: F.adjust_brightness(im, 1.0 + m),
        "Color": lambda im: F.adjust_saturation(im, 1.0 + m),
        "Contrast": lambda im: F.adjust_contrast(im, 1.0 + m),
        "Sharpness": lambda im: F.adjust_sharpness(im, 1.0 + m),
        "Posterize": lambda im: F.posterize(im, int(m)),
        "Solarize": lambda im: F.solarize(im, 255.0 * m),
        "AutoContrast": F.autocontrast,
        "Equalize": F.equalize,
        "Invert": F.invert,
        "Hue": lambda im: F.adjust_hue(im, 0.1),
    }[name]


def _cases(batch: int, size: int):
    """(label, ours(images, ids), torchvision per image or None)."""
    ids = np.arange(batch)
    out = []
    for name in policies.TV_AA_OPS + ("Hue",):
        bins = policies.tv_magnitudes(name, 31, size, size)
        m = 0.0 if bins is None else float(bins[BIN])
        kernels, args = policies.tv_kernels(np.asarray([name]), np.asarray([m]))
        kernel, arg = ("hue", 0.1) if name == "Hue" else (kernels[0], args[0])
        label = f"{name} ({kernel} {arg:g})" if bins is not None or name == "Hue" else name
        out.append((label, lambda x, k=kernel, a=arg: ops.apply_ops(x, [k] * len(x), [a] * len(x))[0], _tv_op(name, m)))
    seeded = dict(seed=0, epoch=0)
    for label, ours, theirs in (
        ("RandAugment(2, 9)", policies.RandAugment(), v2.RandAugment()),
        ("TrivialAugmentWide()", policies.TrivialAugmentWide(), v2.TrivialAugmentWide()),
        ("AutoAugment(imagenet)", policies.AutoAugment(), v2.AutoAugment()),
        ("ColorJitter(.4, .4, .4, .1)", jitter.ColorJitter(0.4, 0.4, 0.4, 0.1), v2.ColorJitter(0.4, 0.4, 0.4, 0.1)),
        ("RandomErasing(p=1, const)", erasing.RandomErasing(1.0), v2.RandomErasing(1.0)),
    ):
        out.append((label, lambda x, t=ours: t(x, ids[: len(x)], **seeded), theirs))
    mix = Mixing(mixup_alpha=0.8, cutmix_alpha=1.0, mode="elem", num_classes=1000)
    targets = torch.arange(batch) % 1000
    out.append(("MixUp/CutMix (elem)", lambda x: mix(x, targets[: len(x)].to(x.device), ids[: len(x)], **seeded), None))
    return out


def _time(fn: Callable[[], object], repeats: int, device: torch.device) -> float:
    best = math.inf
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def run(*, batch: int = 256, size: int = 224, repeats: int = 3, device: str = "cpu") -> dict:
    """Time every case; returns ``{"machine": {...}, "rows": [{op, ours_ms, torchvision_ms, ratio}]}``."""
    dev = torch.device(device)
    gen = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (batch, 3, size, size), generator=gen, dtype=torch.uint8).to(dev)
    rows = []
    for label, ours, theirs in _cases(batch, size):
        ours(images[:8])  # warm-up: allocator, kernels
        ms = _time(lambda f=ours: f(images), repeats, dev)
        tv_ms = None
        if theirs is not None:
            [theirs(im) for im in images[:8]]
            tv_ms = _time(lambda t=theirs: [t(im) for im in images], repeats, dev)
        rows.append(dict(op=label, ours_ms=ms, torchvision_ms=tv_ms, ratio=None if tv_ms is None else tv_ms / ms))
    machine = dict(
        torch=torch.__version__,
        torchvision=torchvision.__version__,
        device=torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        cpu=platform.processor() or platform.machine(),
        cores=os.cpu_count(),
        threads=torch.get_num_threads(),
        batch=batch,
        size=size,
        repeats=repeats,
    )
    return dict(machine=machine, rows=rows)


def table(result: dict) -> str:
    m = result["machine"]
    head = (
        f"torch {m['torch']}, torchvision {m['torchvision']}, device {m['device']}, {m['cpu']} "
        f"({m['cores']} cores, {m['threads']} torch threads); batch {m['batch']} x 3 x {m['size']}^2 uint8, "
        f"best of {m['repeats']}\n\n"
        "| op | ours ms/batch | torchvision ms/batch (per-image loop) | ratio (tv / ours) |\n|---|---:|---:|---:|\n"
    )
    fmt = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
    return head + "\n".join(
        f"| {r['op']} | {r['ours_ms']:.1f} | {fmt(r['torchvision_ms'], '.1f')} | {fmt(r['ratio'], '.2f')} |"
        for r in result["rows"]
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    p.add_argument("--json", action="store_true", help="print the result as JSON instead of the table")
    a = p.parse_args(argv)
    if a.batch < 2 or a.batch % 2 or a.size < 8 or a.repeats < 1:
        p.error("--batch must be even and >= 2, --size >= 8, --repeats >= 1")
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        p.error(f"--device {a.device}: no CUDA device here")
    result = run(batch=a.batch, size=a.size, repeats=a.repeats, device=a.device)
    print(json.dumps(result, indent=2) if a.json else table(result))


if __name__ == "__main__":
    main()
