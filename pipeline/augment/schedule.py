"""A resolution schedule: the train crop as a function of the epoch (FFCV's progressive resizing).

The fastest published ImageNet recipes train at a low resolution first and raise it as they go
(FFCV's ResNet-50: 160 to 192 px, then evaluate at 256), and evaluate at a higher resolution than
they train (FixRes). ``loader.set_crop(ProgressiveCrop(160, 192, ramp=(11, 13)))`` makes a Loader
apply the schedule at the start of every epoch; ``stoker train --progressive 160:192:11-13``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stoker.errors import ArgumentError

#: the side steps of the ramp (FFCV rounds the interpolated side to multiples of 32)
STEP = 32


@dataclass(frozen=True)
class ProgressiveCrop:
    """The train crop side of each epoch: ``start`` up to epoch ``ramp[0]``, ``end`` from epoch
    ``ramp[1]`` on, and in between the linear interpolation rounded to a multiple of ``step``
    (FFCV's ``get_resolution``). Epochs count from 0. A callable: ``schedule(epoch) -> side``.

    Raises:
        ValueError: a side below 1 or above the Loader's limit, or a ramp that ends before it starts.
    """

    start: int
    end: int
    ramp: tuple[int, int] = (0, 0)
    step: int = STEP

    def __post_init__(self) -> None:
        from .crops import MAX_CROP

        for name in ("start", "end", "step"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= MAX_CROP:
                raise ArgumentError(f"progressive {name}={v!r} must be a side in pixels, 1 to {MAX_CROP}")
        a, b = self.ramp
        if not (isinstance(a, int) and isinstance(b, int) and 0 <= a <= b):
            raise ArgumentError(
                f"progressive ramp={self.ramp!r} must be (first epoch, last epoch) with 0 <= first <= last"
            )

    def __call__(self, epoch: int) -> int:
        a, b = self.ramp
        if epoch <= a:
            return self.start
        if epoch >= b:
            return self.end
        side = float(np.interp(epoch, [a, b], [self.start, self.end]))
        side = int(np.round(side / self.step)) * self.step
        return int(min(max(side, min(self.start, self.end)), max(self.start, self.end)))

    def sides(self, epochs: int) -> list[int]:
        """The side of each of ``epochs`` epochs (what a run will train at)."""
        return [self(e) for e in range(epochs)]

    def describe(self, epochs: int) -> str:
        """``"160 px for epochs 1-12, 192 px for epochs 13-16"`` (epochs counted from 1, as runs log them)."""
        runs: list[list[int]] = []
        for e, side in enumerate(self.sides(epochs), 1):
            if runs and runs[-1][0] == side:
                runs[-1][2] = e
            else:
                runs.append([side, e, e])
        return ", ".join(f"{s} px for epoch{'s' if a != b else ''} {a}{f'-{b}' if a != b else ''}" for s, a, b in runs)

    @classmethod
    def parse(cls, text: str, epochs: int) -> ProgressiveCrop:
        """``"START:END[:EPOCHS]"`` for a run of ``epochs`` epochs: the ramp over ``EPOCHS``, which is
        ``A-B`` (START up to epoch A, END from epoch B; epochs count from 0) or ``B`` (``0-B``); by
        default the whole run (``0`` to ``epochs - 1``). FFCV's ResNet-50 at 16 epochs is
        ``160:192:11-13``."""
        parts = str(text).split(":")
        try:
            if len(parts) not in (2, 3):
                raise ValueError
            start, end = int(parts[0]), int(parts[1])
            if len(parts) == 2:
                ramp = (0, max(0, epochs - 1))
            else:
                a, _, b = parts[2].partition("-")
                ramp = (int(a), int(b)) if b else (0, int(a))
        except ValueError:
            raise ArgumentError(
                f"--progressive {text!r} must be START:END[:EPOCHS] in pixels, EPOCHS as A-B or B (e.g. 160:192:11-13)"
            ) from None
        return cls(start, end, ramp)


__all__ = ["STEP", "ProgressiveCrop"]
