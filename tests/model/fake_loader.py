"""A stand-in with the :class:`stoker.pipeline.Loader` interface: synthetic uint8 batches.

Sample ``i`` has label ``i % num_classes`` and an image whose brightness pattern depends
on the label (learnable) plus noise seeded by ``i`` (so a sample is the same every epoch
and after a resume). Order comes from :mod:`stoker.pipeline.order`, like the real Loader.
"""

from __future__ import annotations

import os
import signal
from typing import Any

import torch

from stoker.pipeline.order import num_batches, rank_indices


class FakeLoader:
    def __init__(
        self,
        path: str,
        *,
        batch_size: int,
        train: bool,
        crop: Any,
        device: str = "cpu",
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        backend: str = "auto",
        threads: int | None = None,
        drop_last: bool | None = None,
        channels_last: bool = False,
        num_samples: int = 48,
        num_classes: int = 6,
        signal_at: int | None = None,
        signum: int = signal.SIGTERM,
        **recipe: Any,  # the crop recipe (channels, scale, ratio, crop_pct, val_resize): the real Loader's
    ) -> None:
        side = crop.size[0] if hasattr(crop, "size") else crop  # the recipe, whole (a CropSpec), or a side
        self.path, self.batch_size, self.train, self.crop = path, batch_size, train, side
        self.device, self.seed = torch.device(device), seed
        self.rank, self.world_size = rank or 0, world_size or 1
        self.drop_last = train if drop_last is None else drop_last
        self.channels_last = channels_last
        self.num_samples, self.num_classes = num_samples, num_classes
        self.epoch, self.position = 0, 0  # position: batches already handed out this epoch
        # Test hook: send ourselves `signum` when handing out the `signal_at`-th train batch (1-based, all epochs).
        self.signal_at, self.signum, self.handed_out = signal_at, signum, 0

    def _indices(self):
        return rank_indices(
            self.num_samples,
            seed=self.seed,
            epoch=self.epoch,
            rank=self.rank,
            world_size=self.world_size,
            train=self.train,
        )

    def set_epoch(self, epoch: int) -> None:
        self.epoch, self.position = epoch, 0

    def __len__(self) -> int:
        return num_batches(len(self._indices()), self.batch_size, drop_last=self.drop_last)

    def sample(self, i: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(1000 + int(i))
        img = torch.randint(0, 96, (3, self.crop, self.crop), generator=g, dtype=torch.int32)
        label = int(i) % self.num_classes
        img[label % 3] += 60 * (1 + label // 3)  # the class signal
        flip = torch.Generator().manual_seed(hash((self.seed, self.epoch, int(i))) & 0xFFFF)
        if self.train and torch.rand((), generator=flip) < 0.5:
            img = img.flip(-1)
        return img.clamp(0, 255).to(torch.uint8)

    def __iter__(self):
        idx = self._indices()
        n = len(self)
        while self.position < n:
            sel = idx[self.position * self.batch_size : (self.position + 1) * self.batch_size]
            self.position += 1
            if self.train:
                self.handed_out += 1
                if self.handed_out == self.signal_at:
                    os.kill(os.getpid(), self.signum)
            x = torch.stack([self.sample(i) for i in sel]).to(self.device)
            if self.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            y = torch.as_tensor([int(i) % self.num_classes for i in sel], dtype=torch.int64, device=self.device)
            yield x, y

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.position = state["epoch"], state["position"]


def factory(**extra: Any):
    """A loader_factory for :func:`stoker.model.train.train` (extra kwargs go to every FakeLoader)."""
    return lambda path, **kw: FakeLoader(path, **{**kw, **extra})
