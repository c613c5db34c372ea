"""The GPU check: measure stoker on a CUDA machine in a few minutes; one JSON, one table.

Runs, each part in its own process with its own time box (a part that fails or runs out
of time is recorded, and the next one still runs):

  environment   versions, GPU, which Loader backend and nvjpeg decoder ``auto`` picks
                here and why, which decoders work
  pytest        ``pytest -m gpu`` over stoker's tests
  data          DATA packed with the default settings, --repeat times (a packed dataset is
                unpacked and repacked so; used as is with --repeat 1; without --data,
                generated images)
  loader        the Loader's nvjpeg vs pil backends, images/s at --batch-size, --crop
                (train augmentation, batches delivered to the GPU); then the nvjpeg
                backend's variants: each decoder, overlap off, nvImageCodec's hardware
                share 0 / 1, region decode off (stage seconds and their overlap each)
  bench-model   ResNet-50 and the inception net alone: fp32 / bf16 / fp16 (GradScaler) x
                channels_last x torch.compile (``stoker bench-model``'s measurement)
  train         a short ``stoker train --arch resnet50 --amp bf16 --channels-last``, then
                the same with --compile, each with the fraction of step time spent
                waiting for data

and writes OUT/gpu_check.json and OUT/gpu_check.md (plus each part's log in OUT/logs/).
Without CUDA the GPU parts are skipped with the reason; --cpu-smoke runs them at
miniature size on the CPU instead (to test this script, not to measure anything).
Exit status 0 when every part ran or was skipped, 1 when one failed or ran out of time.

examples:
  python -m stoker.benchmarks.gpu_check --data ~/data/imagenet-sample --out gpu-out
  python -m stoker.benchmarks.gpu_check --data out/train --out gpu-out --parts environment,loader
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from stoker.errors import UsageError
from stoker.tools.common.results import Result

from .proc import run_part, write_json
from .report import format_markdown, targets
from .steps import PARTS

__all__ = ["gpu_check", "GpuCheckResult", "PARTS", "LIMITS"]

HELP = "measure stoker on a GPU (nvjpeg variants vs pil loader, bench-model, train eager + compiled): JSON + markdown"

#: default time box of each part, seconds: together the default ``budget`` (480 s, one
#: command of 8 minutes), the loader's and train's the largest (variants; a compile)
LIMITS = {"environment": 30, "pytest": 90, "data": 50, "loader": 120, "bench-model": 50, "train": 140}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--data",
        metavar="DIR",
        help="images (a folder, or class subfolders) to pack, or a packed dataset/split "
        "(repacked --repeat times; as is with --repeat 1) (default: generated images)",
    )
    p.add_argument("--out", required=True, metavar="OUT", help="output folder (created)")
    p.add_argument("--parts", default=",".join(PARTS), help="comma-separated subset of: " + ",".join(PARTS))
    p.add_argument(
        "--budget",
        type=float,
        default=480.0,
        metavar="S",
        help="seconds for all parts together (default 480); each part also has its own box",
    )
    p.add_argument(
        "--limit",
        action="append",
        default=[],
        metavar="PART=S",
        help="time box of one part in seconds (repeatable), e.g. --limit bench-model=300",
    )
    p.add_argument("--batch-size", type=int, default=256, help="default 256")
    p.add_argument("--crop", type=int, default=224, help="default 224")
    p.add_argument(
        "--repeat",
        type=int,
        default=4,
        help="pack the images this many times, so an epoch outlasts the loader's start (default 4)",
    )
    p.add_argument(
        "--synthetic",
        type=int,
        default=600,
        metavar="N",
        help="images generated when --data is not given (default 600)",
    )
    p.add_argument("--loader-seconds", type=float, default=15.0, help="timed seconds per backend (default 15)")
    p.add_argument("--model-seconds", type=float, default=2.0, help="timed seconds per bench-model setting (default 2)")
    p.add_argument("--train-epochs", type=int, default=3, help="epochs of the train part (default 3)")
    p.add_argument(
        "--cpu-smoke",
        action="store_true",
        help="without CUDA, run the GPU parts at miniature size on the CPU (tests this script)",
    )


@dataclasses.dataclass
class GpuCheckResult(Result):
    """What the GPU check measured: ``OUT/gpu_check.json`` is :meth:`to_dict`.

    Attributes:
        tool: ``"stoker gpu_check"``.
        settings: ``data``, ``batch_size``, ``crop``, ``repeat``, ``loader_seconds``,
            ``model_seconds``, ``train_epochs``, ``smoke`` (the sizes run, miniature in a smoke run).
        budget_s: Seconds allowed for all parts together.
        seconds: Seconds the check took.
        parts: One record per part run, in order: ``status`` (``ok``, ``skipped``, ``failed``,
            ``timeout``), ``seconds``, ``result`` (what a failed or timed-out part finished),
            ``why`` (skipped), ``error`` (one line), ``log`` (the part's output).
        targets: ``nvjpeg_vs_pil``, ``nvjpeg_img_s``, ``train_data_wait`` and
            ``train_data_wait_compiled``: ``target``, ``measured``, ``met``.
    """

    tool: str
    settings: dict
    budget_s: float
    seconds: float
    parts: dict
    targets: dict

    @property
    def ok(self) -> bool:
        """Every part ran or was skipped (none failed or ran out of time)."""
        return all(r["status"] in ("ok", "skipped") for r in self.parts.values())

    def format_markdown(self) -> str:
        """The report ``OUT/gpu_check.md`` holds."""
        return format_markdown(self.to_dict())


def _check_settings(
    parts: Sequence[str],
    limits: Mapping[str, float],
    counts: dict[str, int],
    seconds: dict[str, float],
    data: Path | None,
) -> None:
    unknown = sorted(set(parts) - set(PARTS))
    if unknown or not parts:
        raise UsageError(f"--parts: unknown part(s) {unknown}; choose from {', '.join(PARTS)}")
    for name, value in counts.items():
        if value < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1")
    if min(seconds.values()) <= 0:
        raise UsageError("--budget, --loader-seconds and --model-seconds must be > 0")
    if data is not None and not data.is_dir():
        raise UsageError(f"--data {data} is not a folder")
    for name, value in limits.items():
        if name not in LIMITS:
            raise UsageError(f"--limit {name}={value}: expected PART=SECONDS with PART one of {', '.join(PARTS)}")
        if value <= 0:
            raise UsageError(f"--limit {name}={value:g}: must be > 0 seconds")


def gpu_check(
    data: str | Path | None,
    out: str | Path,
    *,
    parts: Sequence[str] | None = None,
    budget: float = 480.0,
    limits: Mapping[str, float] | None = None,
    batch_size: int = 256,
    crop: int = 224,
    repeat: int = 4,
    synthetic: int = 600,
    loader_seconds: float = 15.0,
    model_seconds: float = 2.0,
    train_epochs: int = 3,
    cpu_smoke: bool = False,
) -> GpuCheckResult:
    """Run the parts of the GPU check, each in a child process within its time box, and write
    ``OUT/gpu_check.json`` and ``OUT/gpu_check.md`` (each part's log in ``OUT/logs/``).

    A part that fails or runs out of time is recorded with what it finished; the next one
    still runs. Without CUDA the GPU parts are skipped with the reason.

    Args:
        data: Images to pack (a folder, or class subfolders), or a packed dataset or split
            (unpacked and packed ``repeat`` times; used as it is with ``repeat=1``); None:
            ``synthetic`` generated images.
        out: The output folder (created; an old report in it is removed first).
        parts: Which of :data:`PARTS` to run (None: all); ``data`` runs whenever ``loader`` or
            ``train`` needs it, ``environment`` always.
        budget: Seconds for all parts together.
        limits: Time box of some parts, seconds (the others: :data:`LIMITS`).
        batch_size: Batch size of the loader, bench-model and train parts.
        crop: Crop side (the model's image size).
        repeat: How many times the images are packed, so an epoch outlasts the loader's start.
        synthetic: Images generated when ``data`` is None.
        loader_seconds: Timed seconds per Loader backend.
        model_seconds: Timed seconds per bench-model setting.
        train_epochs: Epochs of the train part.
        cpu_smoke: Without CUDA, run the GPU parts at miniature size on the CPU (tests the
            check; measures nothing).

    Returns:
        The :class:`GpuCheckResult`; :attr:`GpuCheckResult.ok` is False when a part failed or
        ran out of time.

    Raises:
        UsageError: An unknown part, a count below 1, a time that is not > 0, or a ``data``
            that is not a folder (nothing is written then).
    """
    parts = list(PARTS) if parts is None else [p for p in parts if p]
    limits = dict(limits or {})
    _check_settings(
        parts,
        limits,
        {
            "batch_size": batch_size,
            "crop": crop,
            "repeat": repeat,
            "synthetic": synthetic,
            "train_epochs": train_epochs,
        },
        {"budget": budget, "loader_seconds": loader_seconds, "model_seconds": model_seconds},
        Path(data) if data else None,
    )
    limits = {**LIMITS, **limits}
    out = Path(out)
    for sub in ("parts", "logs"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    for name in ("gpu_check.json", "gpu_check.md"):  # never leave an old report beside a new run
        (out / name).unlink(missing_ok=True)
    ctx = {
        "out": str(out.resolve()),
        "data": str(Path(data).resolve()) if data else None,
        "batch_size": batch_size,
        "crop": crop,
        "repeat": repeat,
        "synthetic": synthetic,
        "loader_seconds": loader_seconds,
        "model_seconds": model_seconds,
        "train_epochs": train_epochs,
        "cuda": False,
        "smoke": False,
        "split": None,
        "root": None,
    }
    t0 = time.monotonic()
    records: dict[str, dict] = {}
    env = run_part("environment", ctx, min(limits["environment"], budget), out)
    records["environment"] = env
    ctx["cuda"] = bool((env.get("result") or {}).get("cuda"))
    ctx["smoke"] = not ctx["cuda"] and cpu_smoke
    if ctx["smoke"]:  # miniature sizes: this exercises the check, it measures nothing
        ctx.update(batch_size=min(batch_size, 4), crop=min(crop, 32), loader_seconds=min(loader_seconds, 1.0))
    for name in PARTS[1:]:
        if name not in parts and not (name == "data" and {"loader", "train"} & set(parts)):
            continue
        left = budget - (time.monotonic() - t0)
        if left < 5:
            records[name] = {
                "status": "timeout",
                "error": f"not started: the {budget:.0f} s budget was spent",
                "seconds": 0.0,
            }
            continue
        rec = records[name] = run_part(name, ctx, min(limits[name], left), out)
        if name == "data" and rec["status"] == "ok":
            ctx["split"], ctx["root"] = rec["result"]["split"], rec["result"]["root"]
    settings = {
        k: ctx[k]
        for k in ("data", "batch_size", "crop", "repeat", "loader_seconds", "model_seconds", "train_epochs", "smoke")
    }
    seconds = round(time.monotonic() - t0, 1)
    judged = targets({"settings": settings, "parts": records})
    result = GpuCheckResult(
        tool="stoker gpu_check", settings=settings, budget_s=budget, seconds=seconds, parts=records, targets=judged
    )
    write_json(out / "gpu_check.json", result.to_dict())
    (out / "gpu_check.md").write_text(result.format_markdown())
    return result


def _parse_limits(items: Sequence[str]) -> dict[str, float]:
    """``--limit PART=S`` flags as ``{part: seconds}``."""
    limits = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or name not in LIMITS:
            raise UsageError(f"--limit {item!r}: expected PART=SECONDS with PART one of {', '.join(PARTS)}")
        try:
            limits[name] = float(value)
        except ValueError:
            raise UsageError(f"--limit {item!r}: {value!r} is not a number of seconds") from None
    return limits


def main(args: argparse.Namespace) -> int:
    result = gpu_check(
        args.data,
        args.out,
        parts=[p.strip() for p in args.parts.split(",")],
        budget=args.budget,
        limits=_parse_limits(args.limit),
        batch_size=args.batch_size,
        crop=args.crop,
        repeat=args.repeat,
        synthetic=args.synthetic,
        loader_seconds=args.loader_seconds,
        model_seconds=args.model_seconds,
        train_epochs=args.train_epochs,
        cpu_smoke=args.cpu_smoke,
    )
    print(result.format_markdown())
    print(f"wrote {Path(args.out) / 'gpu_check.json'} and {Path(args.out) / 'gpu_check.md'}", file=sys.stderr)
    return 0 if result.ok else 1


def main_argv(argv: list | None = None) -> int:
    """``python -m stoker.benchmarks.gpu_check ARGS``: the check without the ``stoker`` entry point."""
    from stoker.errors import StokerError
    from stoker.tools.cli import Parser

    p = Parser(
        prog="python -m stoker.benchmarks.gpu_check",
        description=__doc__.strip(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
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
