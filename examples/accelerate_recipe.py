"""HuggingFace Accelerate on stoker batches.

    stoker pack images/ data/
    accelerate launch examples/accelerate_recipe.py data          # one process per GPU
    python examples/accelerate_recipe.py data --cpu --epochs 1    # on a laptop

``accelerator.prepare(model, optimizer, train, val)`` wraps the model and optimizer and hands a
stoker Loader back unchanged (Accelerate only rewraps ``torch.utils.data.DataLoader``): the
Loader already splits each epoch across processes, so give it the process's rank and device.
Validation is exact (every sample once over all processes), so plain ``accelerator.reduce``
of sums gives the metric; ``gather_for_metrics`` would not drop anything either.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import torch
import torchvision
from accelerate import Accelerator
from torch import nn

from stoker import StokerError
from stoker.model import with_normalize
from stoker.pipeline import Loader


def get_args_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data", help="the output of `stoker pack` (train/ and val/ inside)")
    p.add_argument("--arch", default="resnet18", help="a torchvision model name")
    p.add_argument("--crop", type=int, default=224)
    p.add_argument("--batch-size", type=int, default=64, help="per process")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--cpu", action="store_true", help="run on the CPU even when a GPU is there")
    return p


def main(argv: Sequence[str] | None = None) -> dict:
    args = get_args_parser().parse_args(argv)
    accelerator = Accelerator(cpu=args.cpu)
    kw = {
        "batch_size": args.batch_size,
        "crop": args.crop,
        "device": accelerator.device,
        "rank": accelerator.process_index,
        "world_size": accelerator.num_processes,
    }
    train = Loader(f"{args.data}/train", train=True, **kw)
    val = Loader(f"{args.data}/val", train=False, **kw)
    net = torchvision.models.get_model(args.arch, num_classes=len(train.dataset.classes))
    model = with_normalize(net)  # takes the Loader's uint8 batches
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    model, optimizer, train, val = accelerator.prepare(model, optimizer, train, val)  # Loaders: as they are
    accelerator.register_for_checkpointing(train)  # accelerator.save_state() keeps its epoch and position

    history = []
    for epoch in range(args.epochs):
        train.set_epoch(epoch)  # optional: without it the next iteration starts the next epoch anyway
        model.train()
        steps = 0
        for images, labels in train:
            loss = nn.functional.cross_entropy(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            accelerator.backward(loss)
            optimizer.step()
            steps += 1
        model.eval()
        totals = torch.zeros(2, device=accelerator.device)
        with torch.no_grad():
            for images, labels in val:
                totals += torch.stack([(model(images).argmax(1) == labels).sum(), labels.new_tensor(len(labels))])
        correct, seen = accelerator.reduce(totals, reduction="sum").tolist()
        accelerator.print(f"epoch {epoch}: {steps} steps, val acc {correct / seen:.3f} over {int(seen)} images")
        history.append({"steps": steps, "val_seen": int(seen), "val_acc": correct / seen})
    summary = {"history": history, "len_train": len(train)}
    train.close()
    val.close()
    return summary


if __name__ == "__main__":
    try:
        main()
    except StokerError as e:  # a user's mistake (no val/ split, a bad path): one line, no traceback
        raise SystemExit(f"accelerate_recipe.py: {e}") from None
