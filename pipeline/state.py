"""The epoch and resume part of a :class:`~.loader.Loader`'s state: which epoch the next
iteration reads, how far into it this rank is, and the ``state_dict`` that continues there.

:class:`EpochState` is a base of the Loader and works on the Loader's own attributes (set in its
constructor, advanced by its iteration); the order (:mod:`.order`) writes and checks the state's
fields and the crop stage (:class:`.stages.CropStage`) the crop a mid-epoch state was saved at.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from . import order

if TYPE_CHECKING:
    from .stages import ActiveIteration, CropStage


class EpochState:
    """Moves a Loader between epochs and in and out of a saved state.

    The Loader holds the attributes: ``epoch``, ``position`` (the samples of it this rank has
    consumed) and ``skipped`` (dropped at run time this epoch), which its iteration advances;
    ``_offset`` (where this rank count's split begins), ``_finished`` (the epoch's last batch is
    out) and ``_resumed`` (the position came from :meth:`load_state_dict`, continued once); and
    the ``order``, ``cropping``, ``seed``, ``path``, ``rank`` and ``_active`` iteration it reads.
    """

    order: order.SampleOrder
    cropping: CropStage
    _active: ActiveIteration
    path: Path | str
    seed: int
    rank: int
    epoch: int
    position: int
    skipped: int
    _offset: int
    _finished: bool
    _resumed: bool

    @property
    def offset(self) -> int:
        """Where this rank count's split of the current epoch begins: 0, or after a resume on
        another number of ranks, the samples the saved ranks had handed out (:mod:`.order`)."""
        return self._offset

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch the next iteration reads. The next iteration starts it at its first
        batch, except right after :meth:`load_state_dict` (it continues where the state says).

        Args:
            epoch: a non-negative integer.

        Raises:
            ValueError: ``epoch`` is not one (:class:`~stoker.errors.ArgumentError`).
        """
        epoch = order.non_negative(epoch, "epoch")
        if epoch != self.epoch or self._finished:
            self._start_epoch(epoch)

    def _start_epoch(self, epoch: int) -> None:
        """``epoch`` from its first batch (its crop, when a schedule sets one)."""
        self.epoch, self.position, self.skipped, self._finished = epoch, 0, 0, False
        self._resumed = False
        self._offset = 0  # a resume on another number of ranks sets it for its epoch
        self.cropping.start_epoch(epoch)

    def state_dict(self) -> dict:
        """``{seed, epoch, position, world_size, num_samples, batch_size}``: where the current (or
        last) iteration stands, so that ``load_state_dict`` of it continues there. ``position``
        counts the samples of ``epoch`` this rank has consumed; once an epoch's last batch is handed
        out the state names the next epoch at position 0. Ranks step in lockstep, so rank 0's state
        says where every rank is; ``offset``: where a resumed rank count's split began (:mod:`.order`)."""
        if self._finished:
            return self.order.state(seed=self.seed, epoch=self.epoch + 1, position=0, offset=0)
        state = self.order.state(seed=self.seed, epoch=self.epoch, position=self.position, offset=self._offset)
        return {**state, **self.cropping.state(self.position)}  # mid-epoch at a crop set since: its size

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state``: the next iteration yields exactly the rest of that epoch.

        The state's seed replaces the constructor's (the order and the augmentation are the
        saved run's; a warning says so when they differ). A train state saved with another number
        of ranks continues the same epoch on this one: the samples the saved ranks had not handed
        out yet, split over the new ranks, each exactly once (:mod:`.order`); keep the global
        batch (``batch_size * world_size``) to keep the steps per epoch. A val state from another
        number of ranks restarts its evaluation (every sample once); ``shuffle="block"`` resumes
        on the same number of ranks only.

        Args:
            state: what :meth:`state_dict` returned (on this or another number of ranks).

        Raises:
            ValueError: a state this Loader cannot continue (another split, order or batch size),
                naming the value (:class:`~stoker.errors.ArgumentError`).
        """
        seed, epoch, position, offset = self.order.restore(state, where=self.path)
        if seed != self.seed:
            warnings.warn(
                f"stoker Loader {self.path}: load_state_dict replaces seed={self.seed} with the state's seed={seed}",
                UserWarning,
                stacklevel=2,
            )
        self._active.supersede()
        self.seed = seed
        self._start_epoch(epoch)
        if position:  # mid-epoch: the rest of it at the crop it started with
            self.cropping.restore(state)
        self.position, self._offset = position, offset
        self._resumed = True  # a val loader continues a restored position once, too

    def _finish_epoch(self, stop: int) -> None:
        """The epoch's last batch is handed out (``stop``: the samples of this rank's epoch); the
        samples it dropped at run time get one warning."""
        self.position = max(self.position, stop)
        self._finished = True
        if self.skipped:
            warnings.warn(
                f"stoker Loader {self.path}: epoch {self.epoch}: skipped {self.skipped} "
                f"undecodable sample(s) on rank {self.rank}",
                RuntimeWarning,
                stacklevel=4,
            )


__all__ = ["EpochState"]
