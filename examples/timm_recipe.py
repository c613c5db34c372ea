"""timm models on stoker batches: the model's own mean/std, normalized on the device.

    stoker pack images/ data/ --val-fraction 0.1
    python examples/timm_recipe.py data --model resnet18 --epochs 1 --device cpu
    python examples/timm_recipe.py data --aa rand-m9-mstd0.5-inc1 --mixup 0.8 --cutmix 1.0 --reprob 0.25

timm models are trained on inputs normalized with *their* statistics (``pretrained_cfg``:
ImageNet's for most CNNs, 0.5/0.5 for many ViTs), so ``with_normalize`` takes them from the
model instead of the ImageNet defaults. ``pretrained=False`` here (no download); with
``pretrained=True`` the same lines apply. timm's training recipe, with its own flag names
(``--aa``, ``--mixup``, ``--cutmix``, ``--reprob``, ``--smoothing``), runs per sample on the
device through the Loader (:mod:`stoker.pipeline.augment`); the val crop is the model's
``crop_pct``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import timm
import timm.data
import torch
from torch import nn

from stoker import StokerError
from stoker.model import with_normalize
from stoker.pipeline import Loader, Manifest
from stoker.pipeline.augment import build_augment, build_mixing


def timm_model(name: str, *, num_classes: int, pretrained: bool = False, **kwargs) -> tuple[nn.Module, dict]:
    """``timm.create_model(name)`` behind a :class:`~stoker.model.Normalize` with the model's
    own mean/std; returns the model and timm's data config (``input_size``, ``crop_pct``, ...)."""
    net = timm.create_model(name, pretrained=pretrained, num_classes=num_classes, **kwargs)
    cfg = timm.data.resolve_model_data_config(net)
    return with_normalize(net, mean=cfg["mean"], std=cfg["std"]), cfg


def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data", help="the output of `stoker pack` (train/ and val/ inside)")
    p.add_argument("--model", default="resnet18")
    p.add_argument("--crop", type=int, default=None, help="default: the model's input_size")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--steps", type=int, default=None, help="stop each epoch after this many steps")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--aa", default=None, help="timm's RandAugment/AutoAugment string, e.g. rand-m9-mstd0.5-inc1")
    p.add_argument("--reprob", type=float, default=0.0, help="random erasing probability")
    p.add_argument("--mixup", type=float, default=0.0, help="MixUp alpha (timm: 0.8)")
    p.add_argument("--cutmix", type=float, default=0.0, help="CutMix alpha (timm: 1.0)")
    p.add_argument("--smoothing", type=float, default=0.1, help="label smoothing (timm's default 0.1)")
    return p


def main(argv: Sequence[str] | None = None) -> dict:
    args = get_args_parser().parse_args(argv)
    device = torch.device(args.device)
    classes = Manifest.load(f"{args.data}/train").classes
    model, cfg = timm_model(args.model, num_classes=len(classes))
    crop = args.crop or cfg["input_size"][-1]  # the side the model was built for
    kw = {"batch_size": args.batch_size, "crop": crop, "device": device}
    augment = (
        build_augment(args.aa, reprob=args.reprob, mean=cfg["mean"], std=cfg["std"]) if args.aa or args.reprob else None
    )
    mixing = build_mixing(args.mixup, args.cutmix, label_smoothing=args.smoothing, num_classes=len(classes))
    smoothing = 0.0 if mixing is not None else args.smoothing  # with mixing the targets arrive smoothed
    train_kw = {**kw, "augment": augment, "mixing": mixing}
    val_kw = {**kw, "crop_pct": cfg.get("crop_pct", 0.875)}
    with (
        Loader(f"{args.data}/train", train=True, **train_kw) as train,
        Loader(f"{args.data}/val", train=False, **val_kw) as val,
    ):
        model = model.to(device).to(memory_format=torch.channels_last)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        steps, accuracy = 0, 0.0
        for epoch in range(args.epochs):
            model.train()
            for step, (images, labels) in enumerate(train):  # uint8 NCHW on `device`
                if args.steps is not None and step == args.steps:
                    break
                # labels: class indices, or soft targets [N, classes] with mixing (as timm's SoftTargetCrossEntropy)
                loss = nn.functional.cross_entropy(model(images), labels, label_smoothing=smoothing)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                steps += 1
            model.eval()
            correct = seen = 0
            with torch.no_grad():
                for images, labels in val:
                    correct += int((model(images).argmax(1) == labels).sum())
                    seen += len(labels)
            accuracy = correct / seen
            print(f"epoch {epoch}: {steps} steps, val acc {accuracy:.3f} over {seen} images")
    return {
        "steps": steps,
        "val_seen": seen,
        "val_acc": accuracy,
        "crop": crop,
        "mean": list(cfg["mean"]),
        "std": list(cfg["std"]),
    }


if __name__ == "__main__":
    try:
        main()
    except StokerError as e:  # a user's mistake (no val/ split, a bad path): one line, no traceback
        raise SystemExit(f"timm_recipe.py: {e}") from None
