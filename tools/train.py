"""Train a network on packed shards: ``stoker train DATA --out RUN``.

Reads DATA/train (and DATA/val when present) through the stoker Loader; uint8 batches
are normalized on the device. The task follows the split's targets (--task auto): classes
are classified (cross-entropy; val top-1/top-5), float targets regressed (K outputs, MSE;
val MSE, MAE, R²), masks segmented (a torchvision segmentation model, cross-entropy with
the ignore index; val mIoU and pixel accuracy), multi-label targets learnt with BCE (val
mAP), boxes detected (a torchvision detector; val COCO mAP and mAP@50). best.pt keeps the best
val figure of the task (top-1, R², mIoU, mAP).

Under ``torchrun --nproc_per_node N`` the same command runs DDP (nccl on GPU, gloo on
CPU; --batch-size is per process). RUN/ receives config.json, metrics.jsonl, console.log, last.pt
(every --ckpt-every steps and each epoch end), best.pt and, with --plot, curves.png (--logger: metrics.csv,
TensorBoard events). Without a terminal (a log file, Slurm) each --log-every window prints one line.
SIGTERM/Ctrl-C write a checkpoint and exit; --resume continues exactly where the run stopped, mid-epoch
included, with the run's saved settings; with a larger --epochs it extends a finished run.

examples:
  stoker train data/ --out runs/a --epochs 10 --batch-size 128 --crop 160
  stoker train ages-packed/ --out runs/age                # float targets (stoker pack ages.csv ages-packed)
  stoker train ages-packed/ --out runs/mine --model nets.py:make_net   # your own network
  stoker train seg-packed/ --out runs/seg --channels 1 --crop 256 --arch deeplabv3_mobilenet_v3_large
  stoker train coco-packed/ --out runs/det --task detect --crop 512 --train-fit scale-jitter --jitter 0.5,1.5
  stoker train --out runs/a --resume                      # the run's own settings (RUN/config.json)
  stoker train data/ --out runs/a --epochs 90 --resume auto   # a job script: continue runs/a, else start it
  stoker train --out runs/a --resume --epochs 15          # extend a finished 10-epoch run
  stoker train other/ --out runs/ft --init-from runs/a/best.pt --lr 0.01   # fine-tune: a new head
  stoker train data/ --out runs/smoke --max-steps 20      # a smoke run
  stoker train data/ --out runs/c --logger csv,tensorboard > train.out 2>&1
  stoker train data/ --out runs/p --epochs 16 --progressive 160:192:11-13 --val-crop 256 --pixel-cache /dev/shm/px
  torchrun --nproc_per_node 2 -m stoker train data/ --out runs/ddp
  stoker train data/ --out runs/mix --mix web:0.7,curated:0.3 --balance classes   # data/web, data/curated
"""

from __future__ import annotations

import argparse
import json
import signal
import sys

# no torch in these imports: `stoker --help` stays instant
from stoker.errors import CheckFailedError, StokerError, UsageError
from stoker.model.train.config import AMP_CHOICES, CHANNELS, MIXUP_MODES, OPTIMIZERS, REMODES, TASKS
from stoker.model.train.mix import BALANCE_CHOICES

from .common.loader_flags import add_crop_flags, add_decode_flags, add_pixel_flags, add_storage_flags, floats
from .common.loader_flags import crop as crop_type
from .common.saved_run import given_flags, note_given, note_given_flags, resume_settings

HELP = "train a network on packed shards (AMP, channels_last, DDP, exact resume)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    note_given_flags(p)  # --resume takes RUN/config.json's settings except the flags given
    p.add_argument(
        "data",
        metavar="DATA",
        nargs="?",
        action=_Data,
        help="dataset root holding train/ (and val/) packed by `stoker pack` (with --resume: the run's own)",
    )
    p.add_argument("--out", required=True, metavar="RUN", help="run directory (created)")
    _model_flags(p)
    _batch_and_resolution_flags(p)
    _augmentation_flags(p)
    _optimizer_flags(p)
    _device_flags(p)
    _run_flags(p)
    _mix_flags(p)


def _mix_flags(p: argparse.ArgumentParser) -> None:
    """Several datasets in proportions, classes in equal shares (exact every epoch, every rank)."""
    g = p.add_argument_group("mix and balance")
    g.add_argument(
        "--mix",
        metavar="NAME:W,...",
        help="train on several datasets in these proportions (DATA/NAME, an absolute path or a URL, each "
        "holding train/ and val/): web:0.7,curated:0.3; val reports each dataset and all together",
    )
    g.add_argument(
        "--balance",
        choices=BALANCE_CHOICES,
        help="classes: each class an equal share of every epoch (a small class repeats, a large one is "
        "sub-sampled); weights: each sample its exact share of the weights `stoker pack --weight-column` stored",
    )
    g.add_argument(
        "--epoch-length",
        type=int,
        metavar="N",
        help="samples an epoch with --mix/--balance (default: the splits' sum, rounded to whole global batches)",
    )


def _model_flags(p: argparse.ArgumentParser) -> None:
    """The network, its task and targets, and the input normalization."""
    g = p.add_argument_group("model and task")
    g.add_argument(
        "--arch",
        default="auto",
        help="auto: inception (for segmentation the same block, per pixel); report (the case study's "
        "original slow net); a torchvision classification model (resnet50, ...); for --task segment a "
        "torchvision segmentation model (fcn_resnet50, deeplabv3_resnet50, ...). No pretrained weights. "
        "(default: %(default)s)",
    )
    g.add_argument(
        "--model",
        default=None,
        metavar="FILE.py:FUNCTION",
        help="your own network instead of --arch: FUNCTION in FILE.py (or package.module:FUNCTION) returns an "
        "nn.Module taking normalized float NCHW input; it is called with num_classes=/num_outputs= and "
        "in_channels=/in_chans= when it accepts them. Checkpoints' 'net' holds its own parameter names",
    )
    g.add_argument(
        "--no-standardize-targets",
        dest="standardize_targets",
        action="store_false",
        help="regression: train on the float targets as they are; by default the network learns "
        "(y - mean) / std per column (the train split's statistics) and answers in the targets' units",
    )
    g.add_argument(
        "--task",
        choices=TASKS,
        default="auto",
        help="auto: what the split's targets are (default); classify; regress (float targets: K outputs, "
        "MSE; on a class split the case study: one output regressed onto the label value); segment "
        "(masks); multilabel",
    )
    g.add_argument(
        "--num-classes",
        type=int,
        default=None,
        metavar="N",
        help="classes (segment: when the manifest does not declare them; default: from the manifest)",
    )
    g.add_argument(
        "--channels",
        type=int,
        choices=CHANNELS,
        default=None,
        help="input channels: 3 (RGB, default) or 1 (grayscale; the first layer is built for it)",
    )
    g.add_argument(
        "--mean",
        type=floats,
        default=None,
        metavar="M[,M,M]",
        help="normalization mean per channel, 0..1 scale (default: ImageNet's; their average for 1 channel)",
    )
    g.add_argument("--std", type=floats, default=None, metavar="S[,S,S]", help="normalization std, as --mean")


def _batch_and_resolution_flags(p: argparse.ArgumentParser) -> None:
    """Epochs, the batch, crops and resolutions, and the pixel cache."""
    g = p.add_argument_group("epochs, batches and crops")
    g.add_argument("--epochs", type=int, default=5, metavar="N", help="epochs to train")
    g.add_argument(
        "-b",
        "--batch-size",
        type=int,
        default=64,
        metavar="N",
        help="per process, as timm's -b (pytorch/examples' -b is the node's total) (default: %(default)s)",
    )
    add_crop_flags(g)
    g = p.add_argument_group("resolution (FFCV's progressive resizing; FixRes: evaluate larger than you train)")
    g.add_argument(
        "--progressive",
        default=None,
        metavar="START:END[:EPOCHS]",
        help="ramp the train crop from START to END px over EPOCHS (A-B: START up to epoch A, END from "
        "epoch B, epochs from 0; B alone: 0-B; default: the whole run), rounded to multiples of 32 as FFCV "
        "does; --crop stays the val crop. FFCV's ResNet-50 at 16 epochs: --progressive 160:192:11-13",
    )
    g.add_argument(
        "--val-crop",
        type=crop_type,
        default=None,
        metavar="PX|H,W",
        help="the val crop, when it differs from --crop (e.g. train 192, evaluate 256 with --crop-pct 0.875)",
    )
    g.add_argument(
        "--buckets",
        default=None,
        metavar="auto|HxW,...",
        help="aspect-ratio buckets: each batch one shape, by its images' own aspect (auto: a few shapes of "
        "about the crop's area from the split's aspect histogram); for a network that takes any size",
    )
    g.add_argument(
        "--bucket-sync",
        action="store_true",
        help="with --buckets: every step one bucket on all ranks (DDP step times match; fewer shapes to compile)",
    )
    add_pixel_flags(p)


def _augmentation_flags(p: argparse.ArgumentParser) -> None:
    """Augmentation per sample, on the device."""
    g = p.add_argument_group("augmentation per sample, on the device (timm's names)")
    g.add_argument(
        "--aa",
        default=None,
        metavar="POLICY",
        help="RandAugment / AutoAugment / TrivialAugment: timm's strings (rand-m9-mstd0.5-inc1, original, v0) "
        "or ta_wide (default: none)",
    )
    g.add_argument(
        "--reprob", metavar="P", type=float, default=0.0, help="random erasing probability (default: %(default)s)"
    )
    g.add_argument("--remode", choices=REMODES, default="const", help="random erasing fill (default: const)")
    g.add_argument(
        "--recount", metavar="N", type=int, default=1, help="random erasing boxes at most (default: %(default)s)"
    )
    g.add_argument(
        "--color-jitter", type=float, default=None, metavar="F", help="colour jitter strength, without --aa (timm)"
    )
    g.add_argument("--mixup", type=float, default=0.0, metavar="ALPHA", help="MixUp alpha (0: off; timm: 0.8)")
    g.add_argument("--cutmix", type=float, default=0.0, metavar="ALPHA", help="CutMix alpha (0: off; timm: 1.0)")
    g.add_argument("--cutmix-minmax", type=floats, default=None, metavar="LO,HI", help="CutMix box size range (timm)")
    g.add_argument(
        "--mixup-prob", metavar="P", type=float, default=1.0, help="probability of mixing a batch (default: 1)"
    )
    g.add_argument(
        "--mixup-switch-prob",
        metavar="P",
        type=float,
        default=0.5,
        help="CutMix instead of MixUp when both (default: 0.5)",
    )
    g.add_argument("--mixup-mode", choices=MIXUP_MODES, default="batch", help="how lambda is drawn (default: batch)")


def _optimizer_flags(p: argparse.ArgumentParser) -> None:
    """The optimizer, its schedule, the loss and the precision."""
    g = p.add_argument_group("optimisation: the optimizer, its schedule, the loss, the precision")
    g.add_argument("--optimizer", choices=OPTIMIZERS, default="sgd", help="SGD (Nesterov) or AdamW")
    g.add_argument(
        "--lr",
        metavar="LR",
        type=float,
        default=None,
        help="peak learning rate (default: sgd 0.1 x global batch/256, adamw 1e-3)",
    )
    g.add_argument("--momentum", metavar="M", type=float, default=0.9, help="SGD (Nesterov) momentum")
    g.add_argument(
        "--weight-decay",
        metavar="WD",
        type=float,
        default=None,
        help="default: sgd 5e-5, adamw 0.05 (not on norms/biases)",
    )
    g.add_argument(
        "--warmup-epochs", metavar="EPOCHS", type=float, default=1.0, help="linear warm-up, then cosine decay to 0"
    )
    g.add_argument(
        "--label-smoothing",
        "--smoothing",
        metavar="F",
        type=float,
        default=0.0,
        help="label smoothing (with --mixup/--cutmix: the mixing's, as timm; default: %(default)s)",
    )
    g.add_argument(
        "--amp",
        choices=AMP_CHOICES,
        default="auto",
        help="auto: bf16 on GPUs that compute it natively (compute capability 8.0+: Ampere and newer), else "
        "fp16 + GradScaler (an RTX 20xx/V100/T4 only emulates bf16); on a CPU bf16 where it has native bf16 "
        "(AMX/AVX512-BF16), else off (default: auto)",
    )


def _device_flags(p: argparse.ArgumentParser) -> None:
    """The device, decoding, seeds."""
    g = p.add_argument_group("device, decoding and seeds")
    g.add_argument("--channels-last", action="store_true", help="model and batches in channels_last memory format")
    g.add_argument("--compile", action="store_true", help="torch.compile the model")
    g.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1 (default: auto)")
    add_decode_flags(g)
    g.add_argument(
        "--torch-threads",
        metavar="N",
        type=int,
        default=None,
        help="torch intra-op threads (CPU training; default: torch's choice)",
    )
    g.add_argument(
        "--seed", metavar="N", type=int, default=0, help="seeds the order, the augmentation and the initial weights"
    )
    g.add_argument(
        "--deterministic",
        action="store_true",
        help="deterministic algorithms (bit-identical reruns and resumes; slower on GPU)",
    )


def _run_flags(p: argparse.ArgumentParser) -> None:
    """Logs, checkpoints, resuming, fine-tuning and the output; object storage."""
    g = p.add_argument_group("logs, checkpoints, resuming and fine-tuning")
    g.add_argument(
        "--log-every",
        type=int,
        default=20,
        metavar="N",
        help="steps between loss reads and metrics rows; where no progress bar shows (output to a file, "
        "Slurm, nohup, --no-progress) each prints a line: step, loss, img/s, data wait, lr, ETA (default: %(default)s)",
    )
    g.add_argument(
        "--logger",
        type=names,
        default=(),
        metavar="csv,tensorboard",
        help="also write the metrics to RUN/metrics.csv (csv) and TensorBoard event files in RUN/ (tensorboard: "
        "pip install 'stoker[tensorboard]'); RUN/metrics.jsonl and RUN/console.log are always written",
    )
    g.add_argument(
        "--max-steps",
        type=int,
        default=None,
        metavar="N",
        help="a smoke run: stop after step N (a checkpoint, then the val pass); the learning-rate schedule "
        "stays the whole run's, so --resume without it continues the run",
    )
    g.add_argument(
        "--ckpt-every", metavar="N", type=int, default=0, help="checkpoint every N steps too (default: epoch ends only)"
    )
    g.add_argument(
        "--resume-from",
        default=None,
        metavar="CKPT",
        help="continue from the checkpoint CKPT (as --resume does from RUN/last.pt)",
    )
    g.add_argument(
        "--resume",
        nargs="?",
        action=_Resume,
        default=None,
        metavar="auto",
        help="continue from RUN/last.pt with the run's settings (RUN/config.json: DATA and flags need not be "
        "repeated; those given change them); a finished run given a larger --epochs is extended on a new "
        "learning-rate schedule. --resume auto: continue when RUN holds a run, else start it (a cluster job "
        "script resubmitted as it is after a preemption). Mid-epoch included, also on another number of "
        "processes (torchrun --nproc_per_node): the epoch goes on with the samples not yet seen, each once. "
        "The run keeps its global batch (--batch-size x processes), so its steps per epoch and its "
        "learning-rate schedule (per step) are unchanged: with 2 -> 1 processes pass twice the --batch-size",
    )
    g.add_argument(
        "--init-from",
        default=None,
        metavar="CKPT",
        help="start a new run from the weights of CKPT (a stoker checkpoint, or a state_dict file such as "
        "torchvision's): the tensors whose names and shapes fit are loaded, the rest (a new head) stay "
        "initialised; one line says which. For fine-tuning: the optimizer and schedule start afresh",
    )
    g.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the run RUN holds (its config, metrics and checkpoints are removed first); without it "
        "and without --resume an existing run is refused",
    )
    g.add_argument("--plot", action="store_true", help="write RUN/curves.png (needs matplotlib)")
    g.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    g.add_argument("--json", action="store_true", help="print the summary as JSON")
    add_storage_flags(p)


class _Resume(argparse.Action):
    """``--resume`` (RUN/last.pt: ``"last"``) or ``--resume auto``; a value that is not ``auto`` is
    DATA written after the flag (``--out runs/a --resume data/``), never swallowed by it."""

    def __call__(self, parser, namespace, values, option_string=None):
        note_given(namespace, self.dest)
        if values is None or values in ("auto", "last"):
            setattr(namespace, self.dest, values or "last")
            return
        setattr(namespace, self.dest, "last")
        if getattr(namespace, "data", None) is not None:
            parser.error(
                f"{values!r}: --resume takes no value (RUN/last.pt) or auto (continue when RUN holds a run, else "
                "start it); a checkpoint is --resume-from CKPT"
            )
        namespace.data = values


class _Data(argparse.Action):
    """DATA, kept when ``--resume`` took it (argparse fills an absent ``nargs="?"`` positional last)."""

    def __call__(self, parser, namespace, values, option_string=None):
        if values is None and getattr(namespace, self.dest, None) is not None:
            return
        setattr(namespace, self.dest, values)


def names(text: str) -> tuple[str, ...]:
    """``"csv,tensorboard"`` -> ``("csv", "tensorboard")`` (an argparse type)."""
    return tuple(v.strip() for v in text.split(",") if v.strip())


def main(args: argparse.Namespace) -> int:
    from stoker.errors import CheckpointError, ManifestError
    from stoker.model.train import TrainConfig, train
    from stoker.pipeline.shards.paths import check_path
    from stoker.pipeline.storage import parse_storage_options

    from .common.loader_flags import pixel_cache
    from .common.units import parse_size

    if args.resume and args.resume_from:
        raise UsageError("give --resume (RUN/last.pt) or --resume-from CKPT, not both")
    tier = pixel_cache(args)
    fields = {
        **vars(args),
        "resume": args.resume_from or args.resume,
        "storage_options": parse_storage_options(args.storage_option) or None,
        "cache_limit": parse_size(args.cache_limit, "--cache-limit") if args.cache_limit else None,
        "pixel_cache_budget": tier.budget if tier is not None else None,
    }
    if args.resume:  # the run's own settings; the flags on this command line change them
        fields, said = resume_settings(args.out, fields, given_flags(args))
        if said and _rank() == 0:
            print(f"stoker train: {said}", file=sys.stderr)
    if fields["data"] is None:
        raise UsageError("DATA is missing: give the packed dataset (DATA/train, DATA/val), or --resume a run in RUN")
    if not fields.get("mix"):  # a mix's DATA holds its datasets, each checked by its Loader
        check_path(fields["data"], "root")  # one line per wrong DATA, the Loader's and every command's
    config = TrainConfig.from_any(fields)
    try:
        summary = train(config)
    except (ManifestError, KeyboardInterrupt):
        raise
    except CheckpointError as e:
        raise CheckFailedError(str(e)) from None
    except StokerError:  # already one line with its exit code (bad arguments, storage, cache, labels)
        raise
    except FloatingPointError as e:  # a diverging loss: the run failed, the request was fine
        raise CheckFailedError(str(e)) from None
    except FileNotFoundError as e:  # DATA without train/
        raise UsageError(str(e)) from None
    if summary["world_size"] > 1 and _rank() != 0:
        return 0
    from stoker.model.train.logs import append_console

    text = json.dumps(summary, indent=1) if args.json else format_summary(summary)
    print(text)
    append_console(summary["run_dir"], text)
    if summary["interrupted"]:
        return 128 + int(getattr(signal, summary["interrupted"]))
    return 0


def _rank() -> int:
    import os

    return int(os.environ.get("RANK", "0"))


def format_summary(s: dict) -> str:
    """A few human lines from :func:`stoker.model.train.train`'s summary."""

    def pct(v):
        return "-" if v is None else f"{100 * v:.1f}%"

    ips = "-" if s["images_per_s"] is None else f"{s['images_per_s']:.0f}"
    run = f"run        {s['run_dir']}  ({s['arch']}, {s['device']}, amp {s['amp']}, {s['world_size']} process(es))"
    if s.get("complete") and s["images_per_s"] is None:  # resumed at its last step: nothing ran
        lines = [run, f"steps      {s['steps']}/{s['total_steps']}: the run is complete (nothing was left to train)"]
    else:
        lines = [
            run,
            f"steps      {s['steps']}/{s['total_steps']} in {s['seconds']:.1f} s"
            + (f"  (stopped by {s['interrupted']}; continue with --resume)" if s["interrupted"] else "")
            + (f"  (--max-steps {s['max_steps']}; continue with --resume)" if s.get("max_steps") else ""),
            f"speed      {ips} images/s, data wait {pct(s['data_wait'])} of train time",
        ]
    val_loss = f", val {s['val_loss']:.4f}" if s["val_loss"] is not None else ""
    lines.append(f"loss       train {s['train_loss']:.4f}{val_loss}")
    if s.get("val"):
        from stoker.model.train.loop import format_val

        lines.append(f"val        {format_val(s['val'], balanced=s.get('balance') == 'classes')}")
    lines.append(f"checkpoint {s['checkpoint']}")
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    from .cli import main as cli_main

    sys.exit(cli_main(["train", *sys.argv[1:]]))
