"""``StokerDataModule``: a PyTorch Lightning ``LightningDataModule`` over a packed dataset.

>>> from stoker.pipeline.lightning import StokerDataModule
>>> dm = StokerDataModule("data", batch_size=256, crop=224)   # data/train, data/val from `stoker pack`
>>> trainer = pl.Trainer(max_epochs=90, accelerator="gpu", devices=8, strategy="ddp")
>>> trainer.fit(with_normalize(net_module), datamodule=dm)   # doctest: +SKIP

The Loaders are built with the trainer's rank and world size and land batches on the
trainer's device. What Lightning (2.x) does with them, read from its source:

* It only rewraps ``torch.utils.data.DataLoader`` instances (``_prepare_dataloader``), so no
  ``DistributedSampler`` is injected and ``use_distributed_sampler`` is ignored: the Loader
  already gives each rank its own exact share (train: disjoint, equal; val: every sample once).
* Each epoch it calls ``set_epoch(epoch)`` on ``loader.sampler`` (and ``batch_sampler.sampler``)
  of the train and the val loader: the Loader reshuffles without user code.
* It reads ``len(loader)`` and stops after that many batches; the Loader ends its epoch on
  the last batch, so the next epoch is full. Its sanity check abandons a val iteration after
  ``num_sanity_val_steps`` batches: a val Loader restarts its epoch at the next ``iter()``.
* It calls ``iter(loader)`` once while checking the loaders; that iterator is dropped unused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stoker.errors import ArgumentError, MissingExtraError, UsageError

from .fsutil import PathLike

try:
    import pytorch_lightning as pl
except ImportError:  # the unified `lightning` package ships the same API as lightning.pytorch
    try:
        import lightning.pytorch as pl  # type: ignore[no-redef]
    except ImportError:
        pl = None  # type: ignore[assignment]

#: the pip extra that installs what this module needs
EXTRA = "stoker[lightning]"


if pl is None:
    raise MissingExtraError(
        f"stoker.pipeline.lightning needs PyTorch Lightning: pip install {EXTRA} (or pip install pytorch-lightning)"
    )


class StokerDataModule(pl.LightningDataModule):
    """Train and val :class:`~stoker.pipeline.Loader` s over ``root/train`` and ``root/val``.

    Args:
        root: the output of ``stoker pack`` (a folder holding the ``train`` and ``val`` splits).
        batch_size: samples per batch on each rank.
        val_batch_size: samples per val batch (default: ``batch_size``).
        crop: output side in pixels.
        seed: seeds the train order and augmentation (the same on every rank).
        train_split, val_split: split folder names under ``root`` (``val_split=None``: no val).
        device: where batches land; default: the trainer's device when it is CPU or CUDA,
            else ``"cpu"`` (Lightning then moves the batch).
        augment, mixing: the train Loader's per-sample augmentation and MixUp/CutMix
            (:mod:`stoker.pipeline.augment`: ``augment="rand-m9-mstd0.5-inc1"``,
            ``mixing=build_mixing(0.8, 1.0, num_classes=...)``); val batches are not augmented.
        **loader_kwargs: passed to both Loaders (``backend``, ``threads``, ``channels_last``, ...).

    Batches are uint8 ``[N, C, H, W]`` images and the split's targets (int64 classes, float32
    values or multi-hot, uint8 masks ``[N, H, W]``): put :func:`stoker.model.with_normalize` in
    front of the network.
    """

    def __init__(
        self,
        root: PathLike,
        *,
        batch_size: int,
        val_batch_size: int | None = None,
        crop: int = 224,
        seed: int = 0,
        train_split: str = "train",
        val_split: str | None = "val",
        device: str | Any | None = None,
        augment: Any = None,
        mixing: Any = None,
        **loader_kwargs: Any,
    ):
        super().__init__()
        for name in ("rank", "world_size", "train", "path"):
            if name in loader_kwargs:
                raise ArgumentError(
                    f"StokerDataModule sets {name}= itself (from the trainer and the split names); drop it"
                )
        self.root = Path(root)
        self.batch_size = batch_size
        self.val_batch_size = batch_size if val_batch_size is None else val_batch_size
        self.crop, self.seed, self.device = crop, seed, device
        self.train_split, self.val_split = train_split, val_split
        self.loader_kwargs = loader_kwargs
        self.augment, self.mixing = augment, mixing
        self._loaders: dict = {}
        if val_split is not None and not (self.root / val_split / "stoker.json").exists() and "://" not in str(root):
            raise UsageError(
                f"{self.root} has no {val_split}/ split (no {self.root / val_split / 'stoker.json'}): pass "
                "val_split=None to train without validation, or pack with --val-fraction 0.1"
            )

    # ---- what the trainer tells us --------------------------------------------------------
    def _placement(self) -> tuple[int, int, Any]:
        trainer = self.trainer
        if trainer is None:  # used without a Trainer (e.g. to inspect the loaders)
            return 0, 1, self.device or "cpu"
        device = self.device
        if device is None:
            root = trainer.strategy.root_device
            device = root if root.type in ("cpu", "cuda") else "cpu"
        return trainer.global_rank, trainer.world_size, device

    def _loader(self, split: str, *, train: bool, batch_size: int, **recipe: Any):
        from .loader import Loader

        rank, world, device = self._placement()
        key = (split, rank, world, str(device))
        loader = self._loaders.get(key)
        if loader is None:
            # One Loader per split for the whole fit: Lightning calls set_epoch on it each epoch.
            loader = Loader(
                self.root / split,
                batch_size=batch_size,
                train=train,
                crop=self.crop,
                seed=self.seed,
                rank=rank,
                world_size=world,
                device=device,
                **self.loader_kwargs,
                **recipe,
            )
            self._loaders[key] = loader
        return loader

    # ---- LightningDataModule --------------------------------------------------------------
    def train_dataloader(self):
        recipe = {k: v for k, v in (("augment", self.augment), ("mixing", self.mixing)) if v is not None}
        return self._loader(self.train_split, train=True, batch_size=self.batch_size, **recipe)

    def val_dataloader(self):
        if self.val_split is None:
            return []  # Lightning's way of saying "no validation"
        return self._loader(self.val_split, train=False, batch_size=self.val_batch_size)

    @property
    def classes(self) -> list:
        """Class names of the train split (index = label; a mask split's mask classes)."""
        return list(self._manifest().classes)

    @property
    def target(self):
        """What the train split's samples hold (:class:`~stoker.pipeline.shards.targets.Target`)."""
        return self._manifest().target

    @property
    def num_classes(self) -> int:
        """Classes of a class, multi-label or mask split (a mask's declared classes)."""
        target = self.target
        return target.class_count(self.classes)

    def _manifest(self):
        from .shards.manifest import Manifest

        return Manifest.load(self.root / self.train_split)

    def teardown(self, stage: str) -> None:
        """Close the Loaders (their decode pipelines and shard maps) when the trainer is done."""
        loaders, self._loaders = self._loaders, {}
        for loader in loaders.values():
            loader.close()


__all__ = ["EXTRA", "MissingExtraError", "StokerDataModule"]
