"""How fast does the model alone train? ``stoker bench-model``.

Trains each model on a synthetic uint8 batch that is already on the device (no data
loading at all) and reports images/s for fp32 vs bf16 vs fp16 autocast, with and without
channels_last and torch.compile: the ceiling the loader has to keep up with, and which
settings to train with. Warm-up and compilation are not timed.

examples:
  stoker bench-model                                   # GPU: resnet50 + inception, 256 x 224
  stoker bench-model --device cpu --batch-size 8 --image-size 64 --amp fp32,bf16
  stoker bench-model --models resnet18,inception --compile both --json > bench.json
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import json
import platform
import sys
from collections.abc import Sequence
from typing import Any

from stoker.errors import ArgumentError, CheckFailedError, UsageError, one_line
from stoker.tools.common.results import Result

__all__ = ["bench_model", "BenchModelResult", "add_speedups"]

HELP = "model-only training speed: fp32/bf16/fp16 x channels_last x compile on synthetic batches"

_AMP_NAMES = {"fp32": "off", "off": "off", "bf16": "bf16", "fp16": "fp16"}
_BOTH = {"off": [False], "on": [True], "both": [False, True]}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--models",
        default="resnet50,inception",
        help="comma-separated: inception, report, or torchvision names (default: %(default)s)",
    )
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1 (default: auto)")
    p.add_argument("--batch-size", type=int, default=None, help="default: 256 on GPU, 16 on CPU")
    p.add_argument("--image-size", type=int, default=None, help="default: 224 on GPU, 64 on CPU")
    p.add_argument("--num-classes", type=int, default=1000, help="outputs of the networks measured")
    p.add_argument(
        "--amp", default=None, help="comma-separated fp32,bf16,fp16 (default: all three on GPU, fp32,bf16 on CPU)"
    )
    p.add_argument("--channels-last", choices=tuple(_BOTH), default="both", help="default: both")
    p.add_argument("--compile", choices=tuple(_BOTH), default=None, help="default: both on GPU, off on CPU")
    p.add_argument(
        "--seconds", type=float, default=None, help="timed seconds per setting (default: 5 on GPU, 1 on CPU)"
    )
    p.add_argument("--steps-min", type=int, default=5, help="timed steps per setting at least (default: %(default)s)")
    p.add_argument("--warmup-steps", type=int, default=3, help="untimed steps first (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print the results as JSON instead of a table")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")


@dataclasses.dataclass
class BenchModelResult(Result):
    """What ``stoker bench-model`` measured; :meth:`to_dict` is its ``--json`` output.

    Attributes:
        date: When, ``YYYY-MM-DD HH:MM UTC``.
        device: The torch device measured on.
        device_name: The GPU's name, or the CPU and its thread count.
        torch: torch's version.
        batch_size: Images per step.
        image_size: Side of the square synthetic input.
        num_classes: Outputs of each model.
        seconds: Timed seconds per setting (at least).
        warmup_steps: Untimed steps per setting first.
        rows: One dict per setting: ``model``, ``amp``, ``channels_last``, ``compile``, then
            ``images_per_s``, ``step_ms``, ``steps``, ``first_step_s``, ``params``,
            ``peak_mem_mb`` or ``error``; and ``speedup`` (see :func:`add_speedups`).
    """

    date: str
    device: str
    device_name: str
    torch: str
    batch_size: int
    image_size: int
    num_classes: int
    seconds: float
    warmup_steps: int
    rows: list

    def format_table(self) -> str:
        """The human table ``stoker bench-model`` prints."""
        lines = [
            f"stoker bench-model: {self.device_name}, torch {self.torch}, {self.date}",
            f"batch {self.batch_size} x {self.image_size}x{self.image_size} synthetic uint8 on {self.device}, "
            f"forward + backward + SGD step",
            "",
            f"{'model':<14}{'amp':<6}{'channels_last':<15}{'compile':<9}{'images/s':>10}{'ms/step':>10}{'vs fp32':>9}",
        ]
        for r in self.rows:
            yes_no = ["yes" if r[k] else "no" for k in ("channels_last", "compile")]
            head = f"{r['model']:<14}{r['amp']:<6}{yes_no[0]:<15}{yes_no[1]:<9}"
            if "error" in r:
                lines.append(head + f"  failed: {r['error'][:80]}")
            else:
                sp = f"{r['speedup']:.2f}x" if r["speedup"] else "-"
                lines.append(head + f"{r['images_per_s']:>10.1f}{r['step_ms']:>10.1f}{sp:>9}")
        return "\n".join(lines)


def bench_model(
    models: Sequence[str],
    *,
    device: str = "auto",
    batch_size: int | None = None,
    image_size: int | None = None,
    num_classes: int = 1000,
    amps: Sequence[str] | None = None,
    channels_last: str = "both",
    compile: str | None = None,
    seconds: float | None = None,
    steps_min: int = 5,
    warmup_steps: int = 3,
    progress: bool = True,
) -> BenchModelResult:
    """Train each model on a synthetic uint8 batch on the device, for every setting; images/s.

    Args:
        models: ``inception``, ``report`` or torchvision model names.
        device: ``auto``, ``cpu``, ``cuda``, ``cuda:1``, ...
        batch_size: Images per step (None: 256 on a GPU, 16 on the CPU).
        image_size: Side of the square input (None: 224 on a GPU, 64 on the CPU).
        num_classes: Outputs of each model.
        amps: Of ``fp32``, ``bf16``, ``fp16`` (None: all three on a GPU, fp32 and bf16 on the CPU).
        channels_last: ``off``, ``on`` or ``both``.
        compile: ``torch.compile`` ``off``, ``on`` or ``both`` (None: both on a GPU, off on the CPU).
        seconds: Timed seconds per setting, at least (None: 5 on a GPU, 1 on the CPU).
        steps_min: Timed steps per setting, at least.
        warmup_steps: Untimed steps per setting first (compilation included).
        progress: Show a progress bar on stderr.

    Returns:
        The :class:`BenchModelResult`; a setting that failed (no fp16 kernel, no compiler) has an
        ``error`` row instead of figures.

    Raises:
        ValueError: An unknown amp, choice or model name, or a device this machine does not have
            (before any timing).
    """
    import torch
    from tqdm import tqdm

    from stoker.model.nets import build_model
    from stoker.model.throughput import measure_model
    from stoker.model.train.runtime import resolve_device

    dev = resolve_device(device)
    _check_available(dev, device)
    gpu = dev.type == "cuda"
    batch_size = batch_size or (256 if gpu else 16)
    image_size = image_size or (224 if gpu else 64)
    amps = amps or (["fp32", "bf16", "fp16"] if gpu else ["fp32", "bf16"])
    compile = compile or ("both" if gpu else "off")
    seconds = seconds if seconds is not None else (5.0 if gpu else 1.0)
    for a in amps:
        if a not in _AMP_NAMES:
            raise ArgumentError(f"amp {a!r} is not one of fp32, bf16, fp16")
    for name, value in (("channels_last", channels_last), ("compile", compile)):
        if value not in _BOTH:
            raise ArgumentError(f"{name} {value!r} is not one of {', '.join(_BOTH)}")
    for m in models:
        build_model(m, num_classes, image_size=image_size)  # unknown names fail before any timing

    combos = [(m, a, cl, co) for m in models for a in amps for cl in _BOTH[channels_last] for co in _BOTH[compile]]
    rows = []
    for m, a, cl, co in tqdm(combos, desc="bench-model", unit="setting", disable=not progress, file=sys.stderr):
        row: dict[str, Any] = {"model": m, "amp": a, "channels_last": cl, "compile": co}
        try:
            torch.manual_seed(0)
            net = build_model(m, num_classes, image_size=image_size)
            r = measure_model(
                net,
                batch_size=batch_size,
                image_size=image_size,
                device=dev,
                amp=_AMP_NAMES[a],
                channels_last=cl,
                compile=co,
                seconds=seconds,
                steps_min=steps_min,
                warmup_steps=warmup_steps,
            )
            row.update({k: r[k] for k in ("images_per_s", "step_ms", "steps", "first_step_s", "params", "peak_mem_mb")})
        except Exception as e:  # boundary: reported in its row (all rows failed: main() exits 1)
            row["error"] = one_line(e, with_type=True, limit=300)
        finally:
            if gpu:
                torch.cuda.empty_cache()
        rows.append(row)
    add_speedups(rows)
    return BenchModelResult(
        date=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        device=str(dev),
        device_name=(
            torch.cuda.get_device_name(dev)
            if gpu
            else f"CPU {platform.processor() or platform.machine()} x {torch.get_num_threads()} threads"
        ),
        torch=torch.__version__,
        batch_size=batch_size,
        image_size=image_size,
        num_classes=num_classes,
        seconds=seconds,
        warmup_steps=warmup_steps,
        rows=rows,
    )


def _check_available(dev, asked: str) -> None:
    """A device torch cannot use here (``mps`` off a Mac, ``cuda:3`` on a 1-GPU machine) is a
    one-line ArgumentError, before any model is built (every row would fail)."""
    import torch

    if dev.type == "cpu":
        return
    if dev.type == "cuda":  # resolve_device checked that CUDA is there
        n = torch.cuda.device_count()
        if dev.index is not None and dev.index >= n:
            raise ArgumentError(f"device={asked!r}: torch sees {n} CUDA device(s) here (cuda:0..cuda:{n - 1})")
        return
    if dev.type == "mps":
        ok = torch.backends.mps.is_available()
    else:  # xpu, ...: the backend's own is_available, when it has one
        check = getattr(getattr(torch, dev.type, None), "is_available", None)
        ok = bool(check()) if callable(check) else False
    if not ok:
        raise ArgumentError(
            f"device={asked!r} is not available here (torch {torch.__version__} sees no {dev.type} device); "
            f"try auto, cpu or cuda"
        )


def add_speedups(rows: list[dict[str, Any]]) -> None:
    """Set each row's ``speedup``: its images/s over the same model's plain fp32 row (fp32, no
    channels_last, no compile); None for a failed row or a model without that row."""
    for r in rows:
        base = next(
            (
                b
                for b in rows
                if b["model"] == r["model"]
                and b["amp"] == "fp32"
                and not b["channels_last"]
                and not b["compile"]
                and "images_per_s" in b
            ),
            None,
        )
        r["speedup"] = r["images_per_s"] / base["images_per_s"] if base and "images_per_s" in r else None


def main(args: argparse.Namespace) -> int:
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    amps = [a.strip() for a in args.amp.split(",") if a.strip()] if args.amp else None
    if not models:
        raise UsageError("--models is empty")
    result = bench_model(
        models,
        device=args.device,
        batch_size=args.batch_size,
        image_size=args.image_size,
        num_classes=args.num_classes,
        amps=amps,
        channels_last=args.channels_last,
        compile=args.compile,
        seconds=args.seconds,
        steps_min=args.steps_min,
        warmup_steps=args.warmup_steps,
        progress=args.progress,
    )
    print(json.dumps(result.to_dict(), indent=1) if args.json else result.format_table())
    failed = [r for r in result.rows if "error" in r]
    if result.rows and len(failed) == len(result.rows):  # a table of failures is no measurement
        first = failed[0]
        raise CheckFailedError(
            f"every setting failed ({len(failed)} of {len(failed)}), nothing was measured; e.g. "
            f"{first['model']} {first['amp']}: {first['error'][:200]}"
        )
    return 0


def main_argv(argv: Sequence[str] | None = None) -> int:
    """``python -m stoker.benchmarks.model ARGS``: ``stoker bench-model`` without the entry point."""
    from stoker.errors import StokerError
    from stoker.tools.cli import HelpFormatter, Parser

    p = Parser(prog="python -m stoker.benchmarks.model", description=__doc__.strip(), formatter_class=HelpFormatter)
    add_arguments(p)
    args = p.parse_args(argv)
    try:
        return main(args)
    except StokerError as e:
        print(f"bench-model: {'error: ' if e.exit_code == 2 else ''}{e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("bench-model: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main_argv())
