"""How ``stoker diagnose`` times a figure: at least so long and so many steps, in windows.

:class:`Clock` runs a measurement for at least ``seconds`` and :data:`MIN_STEPS` steps; past
``seconds`` it goes on only while the minimum can still be had by :data:`CAP` x ``seconds``.
Its windows (``seconds`` / :data:`WINDOWS` each) give the spread, and :func:`stability`
says whether advice may rest on the figure.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from stoker.errors import ArgumentError
from stoker.model.throughput import synchronize

#: Timed batches/steps every figure needs before advice may rest on it.
MIN_STEPS = 5
#: A measurement stops by ``CAP x seconds`` (if the minimum cannot be had by then, it stops at ``seconds``).
CAP = 3.0
#: Windows per ``seconds``: their rates give the spread.
WINDOWS = 4
#: Windows further apart than this (half their range over the figure) make the figure too noisy to advise on.
NOISY = 0.25


class Clock:
    """Times the steps of one measurement in windows and says when to stop (see the module doc).

    A window closes at the first step that ends ``seconds / WINDOWS`` after the last one
    closed; the device is synchronized there (and only there), so queued GPU work is counted
    in the window that queued it without a sync per step.
    """

    def __init__(self, *, seconds: float, device, min_steps: int = MIN_STEPS, cap: float = CAP) -> None:
        if seconds <= 0:
            raise ArgumentError(f"seconds={seconds} must be > 0")
        self.seconds, self.min_steps, self.max_seconds = seconds, min_steps, cap * seconds
        self.device = None if device is None else torch.device(device)  # a loader's is known at its first batch
        self.window = seconds / WINDOWS
        self.steps = self.images = 0
        self._sync()
        self.t0 = time.perf_counter()
        self.marks = [(self.t0, 0, 0)]  # (time, steps, images) where each window ends

    def tick(self, images: int) -> bool:
        """Count one step of ``images``; True when the measurement is done."""
        self.steps += 1
        self.images += images
        t = time.perf_counter()
        if t - self.marks[-1][0] >= self.window:
            self._sync()
            t = time.perf_counter()
            self.marks.append((t, self.steps, self.images))
        elapsed = t - self.t0
        if elapsed < self.seconds:
            return False
        if self.steps >= self.min_steps:
            return True
        # Short of the minimum: go on only if it can be reached by the cap.
        return elapsed * self.min_steps / self.steps > self.max_seconds

    def _sync(self) -> None:
        if self.device is not None:
            synchronize(self.device)

    def result(self) -> dict:
        """``images_per_s``, ``steps``, ``images``, ``seconds`` and the stability figures."""
        self._sync()
        t = time.perf_counter()
        marks = self.marks
        if marks[-1][1] != self.steps:
            # A last window shorter than half a window joins the one before (one quick step is no window).
            if len(marks) > 2 and t - marks[-1][0] < self.window / 2:
                marks = marks[:-1]
            marks = [*marks, (t, self.steps, self.images)]
        elapsed = marks[-1][0] - self.t0
        rate = self.images / elapsed
        windows = [(b[2] - a[2]) / (b[0] - a[0]) for a, b in zip(marks, marks[1:], strict=False) if b[0] > a[0]]
        return {
            "images_per_s": rate,
            "steps": self.steps,
            "images": self.images,
            "seconds": elapsed,
            **stability(windows, rate, self.steps, elapsed, self.min_steps),
        }


def stability(windows: list, rate: float, steps: int, seconds: float, min_steps: int = MIN_STEPS) -> dict:
    """How far a figure can be trusted, from its window rates.

    Returns:
        ``windows_images_per_s``, ``spread`` (half the range of the window rates over the
        figure, None with fewer than 2 windows), ``trust`` (``"ok"``; ``"few"``: fewer than
        ``min_steps`` steps; ``"noisy"``: spread over :data:`NOISY`) and, unless ok, ``caveat``.
    """
    spread = (max(windows) - min(windows)) / (2 * rate) if len(windows) >= 2 and rate > 0 else None
    out = {"windows_images_per_s": windows, "spread": spread, "trust": "ok"}
    if steps < min_steps:
        out |= {"trust": "few", "caveat": f"too few steps: {steps} in {seconds:.1f} s (advice needs {min_steps})"}
    elif spread is not None and spread > NOISY:
        caveat = f"too noisy: its windows spread ±{spread:.0%} (advice needs ±{NOISY:.0%} or less)"
        out |= {"trust": "noisy", "caveat": caveat}
    return out


def warm_up(step: Callable[[], object], count: int, seconds: float, device) -> float:
    """Run up to ``count`` untimed steps (at least one), fewer once they have taken ``seconds``;
    returns the time of the first (it includes the graph building and autotuning)."""
    t0 = time.perf_counter()
    first = None
    for i in range(max(1, count)):
        step()
        if i == 0:
            synchronize(device)
            first = time.perf_counter() - t0
        if time.perf_counter() - t0 >= seconds:
            break
    synchronize(device)
    return first
