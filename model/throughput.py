"""How fast can the model alone go? Train steps on a synthetic uint8 batch already on the device.

Used by ``stoker bench-model`` (fp32/bf16/fp16 x channels_last x compile tables) and by
``stoker diagnose`` (model speed vs loader speed): no data loading is involved, so the
figure is the ceiling the loader has to keep up with.
"""

from __future__ import annotations

import copy
import time
from typing import Any

import torch
from torch import nn

from stoker.errors import ArgumentError

from .nets import count_parameters
from .normalize import has_normalize, with_normalize
from .train.runtime import make_scaler, resolve_amp, resolve_device
from .train.step import TrainStep, loss_fn


def synchronize(device: torch.device) -> None:
    """Wait for queued work on ``device`` (CUDA kernels run asynchronously; CPU is a no-op)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_model(
    model: nn.Module,
    *,
    batch_size: int = 64,
    image_size: int = 224,
    device: str | torch.device = "auto",
    amp: str = "off",
    channels_last: bool = False,
    compile: bool = False,
    seconds: float = 3.0,
    steps_min: int = 5,
    warmup_steps: int = 3,
) -> dict[str, Any]:
    """Images/s of forward + backward + SGD step on one synthetic uint8 batch.

    A deep copy of ``model`` is trained (the caller's model is left untouched), with
    :class:`~stoker.model.Normalize` prepended unless the model already has one, so the
    input is the loader's uint8 NCHW batch. The batch and random labels are created on
    the device once. Warm-up steps (and compilation) are excluded from the timing; the
    timed loop runs at least ``steps_min`` steps and ``seconds`` seconds, with a device
    synchronize before starting and before stopping the clock (never per step).

    Args:
        model: The network (outputs ``[N, C]``: C > 1 is trained with cross-entropy, C = 1
            with MSE, like ``--task regress``).
        batch_size: Images per step.
        image_size: Side of the square input.
        device: ``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ...
        amp: ``auto|bf16|fp16|off`` (fp16 uses a GradScaler), see
            :func:`stoker.model.train.runtime.resolve_amp`.
        channels_last: Model and batch in channels_last memory format.
        compile: ``torch.compile`` the model first (compile time goes to ``first_step_s``).
        seconds: Minimum timed duration.
        steps_min: Minimum timed steps.
        warmup_steps: Untimed steps first (>= 1).

    Returns:
        ``images_per_s``, ``step_ms``, ``steps``, ``seconds``, ``first_step_s``,
        ``batch_size``, ``image_size``, ``device``, ``amp``, ``channels_last``, ``compile``,
        ``params``, ``peak_mem_mb`` (CUDA, else None), ``loss`` (last, finite check).
    """
    if batch_size < 1 or image_size < 1:
        raise ArgumentError(f"batch_size={batch_size} and image_size={image_size} must be >= 1")
    if seconds < 0 or steps_min < 1 or warmup_steps < 1:
        raise ArgumentError(
            f"seconds={seconds}, steps_min={steps_min}, warmup_steps={warmup_steps}: need >= 0, >= 1, >= 1"
        )
    dev = resolve_device(str(device))
    spec = resolve_amp(amp, dev)
    mf = torch.channels_last if channels_last else torch.contiguous_format

    net = copy.deepcopy(model)
    if not has_normalize(net):
        net = with_normalize(net)
    net = net.to(dev, memory_format=mf).train()
    params = count_parameters(net)

    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (batch_size, 3, image_size, image_size), dtype=torch.uint8, generator=gen)
    x = x.to(dev).contiguous(memory_format=mf)
    with torch.no_grad(), spec.autocast():
        net.eval()
        num_out = net(x[:2]).shape[1]
        net.train()
    if num_out > 1:
        y = torch.randint(0, num_out, (batch_size,), generator=gen).to(dev)
    else:
        y = torch.rand(batch_size, generator=gen).to(dev)

    # fused on CUDA: one kernel per step, and no per-step found_inf sync under an fp16 GradScaler
    opt = torch.optim.SGD(net.parameters(), lr=1e-3, momentum=0.9, fused=dev.type == "cuda")
    fwd = torch.compile(net) if compile else net
    # C > 1 outputs: cross-entropy; one output: the case study's regression (MSE)
    train_step = TrainStep(
        fwd, opt, loss_fn("classify" if num_out > 1 else "regress"), amp=spec, scaler=make_scaler(spec)
    )

    def step() -> torch.Tensor:
        return train_step(x, y)

    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    t = time.perf_counter()
    step()
    synchronize(dev)
    first_step_s = time.perf_counter() - t
    for _ in range(warmup_steps - 1):
        step()
    synchronize(dev)

    steps = 0
    t0 = time.perf_counter()
    # No sync inside the loop: the host queues work ahead; the final sync settles the clock.
    while steps < steps_min or time.perf_counter() - t0 < seconds:
        loss = step()
        steps += 1
    synchronize(dev)
    elapsed = time.perf_counter() - t0
    return {
        "images_per_s": steps * batch_size / elapsed,
        "step_ms": 1000 * elapsed / steps,
        "steps": steps,
        "seconds": elapsed,
        "first_step_s": first_step_s,
        "batch_size": batch_size,
        "image_size": image_size,
        "device": str(dev),
        "amp": spec.name,
        "channels_last": bool(channels_last),
        "compile": bool(compile),
        "params": params,
        "peak_mem_mb": torch.cuda.max_memory_allocated(dev) / 2**20 if dev.type == "cuda" else None,
        "loss": float(loss),
    }
