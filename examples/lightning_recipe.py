"""PyTorch Lightning on stoker batches: a LightningDataModule over a packed dataset.

    stoker pack images/ data/
    python examples/lightning_recipe.py data --devices 8 --strategy ddp    # GPUs
    python examples/lightning_recipe.py data --accelerator cpu --epochs 1  # a laptop

``StokerDataModule`` builds the train/val Loaders with the trainer's rank, world size and device.
Lightning calls ``set_epoch`` on them every epoch (through ``loader.sampler``), injects no
DistributedSampler (it only rewraps torch DataLoaders), and validation sees every sample
exactly once over all processes, so ``sync_dist=True`` averages are exact.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import pytorch_lightning as pl
import torch
import torchvision
from torch import nn

from stoker import StokerError
from stoker.model import with_normalize
from stoker.pipeline.lightning import StokerDataModule


class Classifier(pl.LightningModule):
    def __init__(self, arch: str, num_classes: int, lr: float = 0.1):
        super().__init__()
        self.model = with_normalize(torchvision.models.get_model(arch, num_classes=num_classes))  # uint8 in
        self.lr = lr

    def training_step(self, batch, _):
        images, labels = batch
        loss = nn.functional.cross_entropy(self.model(images), labels)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, _):
        images, labels = batch
        correct = (self.model(images).argmax(1) == labels).float()
        # batch_size= : the last val batch of a rank is smaller; weight the mean by it
        self.log("val_acc", correct.mean(), batch_size=len(labels), sync_dist=True, prog_bar=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data", help="the output of `stoker pack` (train/ and val/ inside)")
    p.add_argument("--arch", default="resnet18", help="a torchvision model name")
    p.add_argument("--crop", type=int, default=224)
    p.add_argument("--batch-size", type=int, default=64, help="per process")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--accelerator", default="auto")
    p.add_argument("--devices", default="auto")
    p.add_argument("--strategy", default="auto")
    p.add_argument("--limit-train-batches", type=int, default=None)
    return p


def main(argv: Sequence[str] | None = None) -> dict:
    args = get_args_parser().parse_args(argv)
    dm = StokerDataModule(args.data, batch_size=args.batch_size, crop=args.crop)
    module = Classifier(args.arch, num_classes=dm.num_classes)
    devices = int(args.devices) if args.devices.isdigit() else args.devices
    trainer = pl.Trainer(
        max_epochs=args.epochs,
        accelerator=args.accelerator,
        devices=devices,
        strategy=args.strategy,
        limit_train_batches=args.limit_train_batches,
        logger=False,
        enable_checkpointing=False,
    )
    trainer.fit(module, datamodule=dm)
    return {"global_step": trainer.global_step, "val_acc": float(trainer.callback_metrics["val_acc"])}


if __name__ == "__main__":
    try:
        main()
    except StokerError as e:  # a user's mistake (no val/ split, a bad path): one line, no traceback
        raise SystemExit(f"lightning_recipe.py: {e}") from None
