"""Images/s through each training framework: stoker's Loader against that framework's usual
torchvision ImageFolder DataLoader, one run side by side.

    python -m stoker.benchmarks.frameworks --images IMAGE_FOLDER --data PACKED/train --seconds 10

Each (framework, loader) pair runs in its own process for ``--seconds`` after its first batch;
the model is a one-layer head (so the figure is the loader as seen through the framework, not
the network). stoker batches are uint8 normalized in the model (``with_normalize``); the
DataLoader's are float32 normalized in its workers, as torchvision's references do.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Sequence

FRAMEWORKS = ("plain", "lightning", "accelerate")
LOADERS = ("stoker", "torchvision")


def _model(loader: str, num_classes: int):
    from torch import nn

    from stoker.model import with_normalize

    head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(3, num_classes))
    return with_normalize(head) if loader == "stoker" else head


def _make_loader(cfg: dict, device):
    if cfg["loader"] == "stoker":
        from stoker.pipeline.loader import Loader

        loader = Loader(
            cfg["data"], batch_size=cfg["batch_size"], crop=cfg["crop"], device=device, threads=cfg["workers"]
        )
        return loader, len(loader.dataset.classes)
    from stoker.tools.bench.runners import torchvision_loader

    dl, ds = torchvision_loader(
        cfg["images"],
        batch_size=cfg["batch_size"],
        crop=cfg["crop"],
        workers=cfg["workers"],
        pin_memory=device.type == "cuda",
    )
    return dl, len(ds.classes)


class _Meter:
    """Counts images from the end of the first step (start-up and warm-up excluded)."""

    def __init__(self, seconds: float):
        self.seconds, self.t0, self.images, self.steps = seconds, None, 0, 0

    def step(self, n: int) -> bool:
        """Record a finished step of ``n`` images; True when the time is up."""
        now = time.perf_counter()
        if self.t0 is None:
            self.t0 = now
            return False
        self.images += n
        self.steps += 1
        return now - self.t0 >= self.seconds

    def result(self) -> dict:
        elapsed = time.perf_counter() - self.t0
        return {
            "images": self.images,
            "steps": self.steps,
            "seconds": round(elapsed, 2),
            "images_per_s": round(self.images / elapsed, 1),
        }


def _run_plain(cfg: dict, device) -> dict:
    import torch

    loader, num_classes = _make_loader(cfg, device)
    model = _model(cfg["loader"], num_classes).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    meter = _Meter(cfg["seconds"])
    while True:
        for images, labels in loader:
            images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
            loss = torch.nn.functional.cross_entropy(model(images), labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if meter.step(len(labels)):
                return meter.result()


def _run_accelerate(cfg: dict, device) -> dict:
    import torch
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=device.type == "cpu")
    loader, num_classes = _make_loader(cfg, accelerator.device)
    model = _model(cfg["loader"], num_classes)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    meter = _Meter(cfg["seconds"])
    while True:
        for images, labels in loader:
            loss = torch.nn.functional.cross_entropy(model(images), labels)
            opt.zero_grad()
            accelerator.backward(loss)
            opt.step()
            if meter.step(len(labels)):
                return meter.result()


def _run_lightning(cfg: dict, device) -> dict:
    import pytorch_lightning as pl
    import torch

    loader, num_classes = _make_loader(cfg, device)
    meter = _Meter(cfg["seconds"])

    class Head(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = _model(cfg["loader"], num_classes)

        def training_step(self, batch, _):
            images, labels = batch
            return torch.nn.functional.cross_entropy(self.model(images), labels)

        def on_train_batch_end(self, outputs, batch, batch_idx):
            if meter.step(len(batch[1])):
                self.trainer.should_stop = True

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    trainer = pl.Trainer(
        max_epochs=10_000,
        accelerator="gpu" if device.type == "cuda" else "cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
    )
    trainer.fit(Head(), train_dataloaders=loader)
    return meter.result()


def _child(cfg: dict) -> dict:
    import warnings

    import torch

    warnings.filterwarnings("ignore")  # framework advice (num_workers, ...) is not the measurement
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    run = {"plain": _run_plain, "lightning": _run_lightning, "accelerate": _run_accelerate}[cfg["framework"]]
    return {**run(cfg, device), "device": str(device)}


def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m stoker.benchmarks.frameworks", description=__doc__.splitlines()[0])
    p.add_argument("--images", required=True, help="an ImageFolder tree (one folder per class)")
    p.add_argument("--data", required=True, help="the same images packed: a split folder (`stoker pack` OUT/train)")
    p.add_argument("--frameworks", default=",".join(FRAMEWORKS), help="comma-separated: " + ", ".join(FRAMEWORKS))
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--crop", type=int, default=224)
    p.add_argument("--workers", type=int, default=None, help="DataLoader workers / Loader threads (default: cores)")
    p.add_argument("--seconds", type=float, default=10.0, help="measured time per run, after the first batch")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--child", help=argparse.SUPPRESS)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    if args.child:
        print(json.dumps(_child(json.loads(args.child))))
        return 0
    from stoker.pipeline.deps import usable_cores

    frameworks = [f.strip() for f in args.frameworks.split(",") if f.strip()]
    bad = sorted(set(frameworks) - set(FRAMEWORKS))
    if bad:
        from stoker.errors import UsageError

        raise UsageError(f"--frameworks: unknown {', '.join(bad)} (choose from {', '.join(FRAMEWORKS)})")
    workers = usable_cores() if args.workers is None else args.workers
    rows = []
    print(f"{'framework':<11} {'loader':<12} {'images/s':>9} {'steps':>6}  device")
    for framework in frameworks:
        for loader in LOADERS:
            cfg = {
                "framework": framework,
                "loader": loader,
                "images": args.images,
                "data": args.data,
                "batch_size": args.batch_size,
                "crop": args.crop,
                "workers": workers,
                "seconds": args.seconds,
            }
            proc = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "stoker.benchmarks.frameworks",
                    "--images",
                    args.images,
                    "--data",
                    args.data,
                    "--child",
                    json.dumps(cfg),
                ],
                capture_output=True,
                text=True,
                check=False,
            )
            if proc.returncode != 0:
                tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
                row = {**cfg, "error": tail}
                print(f"{framework:<11} {loader:<12} {'failed':>9}  {tail}")
            else:
                row = {**cfg, **json.loads(proc.stdout.strip().splitlines()[-1])}
                print(f"{framework:<11} {loader:<12} {row['images_per_s']:>9.1f} {row['steps']:>6}  {row['device']}")
            rows.append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    from stoker.errors import StokerError

    try:
        sys.exit(main())
    except StokerError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
