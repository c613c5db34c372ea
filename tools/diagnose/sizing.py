"""How big a batch ``stoker diagnose`` may measure: sized from the memory it has, never OOM-killed.

A network's training step holds its parameters, their gradients and the optimizer's state
(fixed) plus the activations autograd saves for the backward pass (per sample): the report's
network, one inception block at full resolution, saves ~330 MB a sample at 224x224, so the
default batch of 64 asks ~27 GB of a machine that may not have it. :func:`fit_batch` starts
small: one warm-up step at batch 2, then a training step at batch 2 and at 4, each counting the
bytes of the tensors saved for backward (``torch.autograd.graph.saved_tensors_hooks``: exact,
and the same on every device, where the process's RSS is blurred by the allocator keeping freed
memory) and timing the step. The batch asked for is kept when its step fits in half the host's
available memory (80% of a GPU's free memory) and in the time a figure may take, else the
largest that does. One line says what was chosen, and why.
"""

from __future__ import annotations

import copy
import os
import time
from dataclasses import dataclass

import torch
from torch import nn

#: shares of the available memory a probe batch may use: the host's also holds the loader's
#: workers and batches (what MemAvailable counts is not all free for us); a GPU's, the allocator's slack
HOST_SHARE = 0.5
GPU_SHARE = 0.8


@dataclass(frozen=True)
class BatchFit:
    """The batch :func:`fit_batch` chose and what it rests on (bytes, seconds)."""

    batch: int
    requested: int
    per_sample: int
    fixed: int
    available: int
    step_s: float
    why: str | None = None  # the one line when the batch was lowered

    def peak(self, batch: int) -> int:
        """The predicted peak memory of a training step at ``batch``."""
        return self.fixed + self.per_sample * batch

    def fits(self, batch: int, device) -> bool:
        """Would a step at ``batch`` fit in the memory share this device allows?"""
        return self.peak(batch) <= _share(device) * self.available

    def to_dict(self) -> dict:
        return {
            "batch_size": self.batch,
            "requested": self.requested,
            "bytes_per_sample": self.per_sample,
            "bytes_fixed": self.fixed,
            "bytes_available": self.available,
            "step_s_per_sample": self.step_s,
            "why": self.why,
        }


def _share(device) -> float:
    return GPU_SHARE if torch.device(device).type == "cuda" else HOST_SHARE


def host_available() -> int:
    """Bytes this process may still allocate on the host: ``MemAvailable``, capped by a cgroup
    limit (a container's) minus what the cgroup already uses."""
    avail = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    if avail is None:
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            avail = 1 << 62  # unknown: do not limit
    for limit, used in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
    ):
        try:
            with open(limit) as f, open(used) as g:
                text = f.read().strip()
                if text != "max" and int(text) < 1 << 60:
                    avail = min(avail, int(text) - int(g.read().strip()))
        except (OSError, ValueError):
            continue
    return max(avail, 0)


def available(device) -> int:
    """Bytes a step on ``device`` may use: the GPU's free memory, or :func:`host_available`."""
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    return host_available()


#: a step may always take this long (seconds) before the batch is lowered for time
STEP_FLOOR_S = 5.0

#: the backward pass holds gradients of activations beside the saved ones, and kernels their
#: workspaces: the saved bytes a sample are counted this many times
BACKWARD_FACTOR = 1.3


class _SavedBytes:
    """Counts the bytes of the distinct tensors autograd saves for backward inside the block."""

    def __init__(self):
        self.storages: dict[int, int] = {}

    def _pack(self, t):
        try:
            storage = t.untyped_storage()
            self.storages[storage.data_ptr()] = storage.nbytes()
        except (RuntimeError, NotImplementedError):  # a tensor without storage (sparse, meta)
            pass
        return t

    def __enter__(self):
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)

    @property
    def bytes(self) -> int:
        return sum(self.storages.values())


def fit_batch(
    model: nn.Module,
    requested: int,
    *,
    crop,
    device,
    task=None,
    step_limit_s: float | None = None,
    memory: int | None = None,
) -> BatchFit:
    """The largest batch up to ``requested`` whose training step of ``model`` fits the memory
    ``device`` has (and takes at most ``step_limit_s``), measured from steps at batch 2 and 4 of a
    copy of the model (the caller's is left as it is). ``memory``: the bytes available (default:
    :func:`available`)."""
    from .measure import _EndToEndStep, hw_of, synthetic_targets

    device = torch.device(device)
    size = "x".join(map(str, hw_of(crop)))
    step = _EndToEndStep(copy.deepcopy(model), device=device, task=task)
    gen = torch.Generator().manual_seed(0)

    def measure(batch: int) -> tuple[int, float]:
        x = torch.randint(0, 256, (batch, 3, *hw_of(crop)), dtype=torch.uint8, generator=gen).to(device)
        y = synthetic_targets(task, batch, crop, gen).to(device)
        with _SavedBytes() as saved:
            t0 = time.perf_counter()
            step(x, y)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            seconds = time.perf_counter() - t0
        del x, y
        return saved.bytes, seconds

    # two small batches (2 and 4: BatchNorm after a global pool refuses a batch of 1 in training)
    lo, hi = min(2, requested), min(4, requested)
    try:
        measure(lo)  # warm-up: the optimizer's state, kernels, allocator pools
        p_lo, t_lo = measure(lo)
        p_hi, t_hi = measure(hi) if hi > lo else (p_lo, t_lo)
        per = int(BACKWARD_FACTOR * ((p_hi - p_lo) / (hi - lo) if hi > lo else p_hi / hi))
        # the weights, their gradients and the optimizer's momentum (the weights are among the saved tensors)
        weights = sum(t.numel() * t.element_size() for t in model.parameters())
        fixed = 3 * weights + sum(b.numel() * b.element_size() for b in model.buffers())
        per_s = max((t_hi - t_lo) / max(hi - lo, 1), t_hi / hi, 1e-6)
        avail = available(device) if memory is None else memory
        fit = BatchFit(requested, requested, per, fixed, avail, per_s)
        limit = _share(device) * avail
        by_memory = max(1, int((limit - fixed) // per))
        by_time = max(1, int(step_limit_s // per_s)) if step_limit_s else requested
        # never below the batches the probes ran (a batch of 1 trips BatchNorm after a global pool)
        batch = max(min(requested, lo), min(requested, by_memory, by_time))
        if batch >= requested:
            return fit
        gb = lambda b: f"{b / 1e9:.1f} GB" if b >= 1e8 else f"{b / 1e6:.0f} MB"  # noqa: E731
        where = "the GPU has" if device.type == "cuda" else "the host has"
        if by_memory <= by_time:
            why = (
                f"batch {requested} would need ~{gb(fit.peak(requested))} at {size} ({gb(per)} a sample), "
                f"{where} {gb(avail)} available: measuring at batch {batch}"
            )
        else:
            why = (
                f"a step at batch {requested} would take ~{per_s * requested:.0f} s at {size}: measuring at "
                f"batch {batch} so the run ends in time (per-image figures hold; a longer --seconds measures more)"
            )
        return BatchFit(batch, requested, per, fixed, avail, per_s, why)
    finally:
        step = None  # the model's copy goes now, before the measurements allocate theirs
        if device.type == "cuda":
            torch.cuda.empty_cache()


__all__ = ["STEP_FLOOR_S", "BatchFit", "available", "fit_batch", "host_available"]
