"""Where and how a run computes: the device, the AMP policy, DDP, seeds and determinism.

One AMP resolver serves ``stoker train``, ``stoker bench-model`` and ``stoker diagnose``
(:func:`resolve_amp`); one place starts and ends the process group (:func:`init_distributed`,
:func:`shutdown_distributed`), and the collectives the loop needs are here.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from stoker.errors import ArgumentError

from .config import AMP_CHOICES, check_choice

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "off": torch.float32}


# --------------------------------------------------------------------------- devices, AMP


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``"auto"`` → ``cuda`` (this process's ``LOCAL_RANK`` under torchrun) if available, else ``cpu``."""
    device = str(device)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ArgumentError(f"device={device!r} is not a device (try auto, cpu, cuda, cuda:1)") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ArgumentError(f"device={device!r}: torch sees no CUDA device here")
        if dev.index is None:
            dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", torch.cuda.current_device())))
    return dev


def cpu_bf16() -> bool:
    """True when this CPU has native bf16 math (AVX512-BF16 or AMX), so CPU autocast can pay off."""
    try:
        return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    except AttributeError:  # older torch
        return False


@dataclass(frozen=True)
class AmpSpec:
    """A resolved ``--amp``: ``name`` is bf16|fp16|off, ``why`` says how it was chosen.

    ``autocast()`` is the context to run forward passes in (a no-op when ``enabled`` is False).
    """

    name: str
    dtype: torch.dtype
    enabled: bool
    device_type: str = "cpu"
    why: str = field(default="", compare=False)

    def autocast(self) -> torch.autocast:
        return torch.autocast(self.device_type, dtype=self.dtype, enabled=self.enabled)


def gpu_bf16(device: str | torch.device = "cuda") -> tuple[bool, str]:
    """``(native, what)``: does the GPU ``device`` compute bf16 natively (compute capability 8.0
    or newer: Ampere, Ada, Hopper, Blackwell)? ``torch.cuda.is_bf16_supported()`` also answers True
    on older cards (Turing's RTX 2070 is 7.5) where bf16 is only emulated, slower than their fp16
    tensor cores; this asks the capability itself."""
    dev = torch.device(device)
    props = torch.cuda.get_device_properties(dev.index if dev.index is not None else torch.cuda.current_device())
    what = f"{props.name}, compute capability {props.major}.{props.minor}"
    return props.major >= 8, what


def resolve_amp(amp: str, device: str | torch.device, *, native_cpu_bf16: bool = True) -> AmpSpec:
    """The autocast to use for ``amp`` (one of :data:`~stoker.model.train.config.AMP_CHOICES`) on ``device``.

    ``auto``: bf16 where the GPU computes it natively (:func:`gpu_bf16`: compute capability 8.0
    or newer), fp16 with a GradScaler otherwise (a Turing card such as the RTX 2070 only emulates
    bf16, and its tensor cores run fp16); on the CPU bf16
    when it has native bf16 math (AMX or AVX512-BF16, :func:`cpu_bf16`), else off (bf16
    autocast there is many times slower without bf16 units). ``stoker train``, ``stoker
    bench-model`` and ``stoker diagnose`` all resolve ``auto`` here, so what diagnose measures
    for ``auto`` is what training then does. ``native_cpu_bf16=False`` keeps ``auto`` off on
    every CPU. bf16 and fp16 may also be asked for on the CPU (autocast supports both).
    """
    check_choice("amp", amp, AMP_CHOICES)
    dev = torch.device(device)
    if amp != "auto":
        name, why = amp, f"--amp {amp}"
    elif dev.type == "cuda":
        native, what = gpu_bf16(dev)
        name, why = (
            ("bf16", f"auto: native bf16 on {what}")
            if native
            else ("fp16", f"auto: fp16 with a GradScaler on {what} (bf16 would be emulated, not native, before 8.0)")
        )
    elif dev.type == "cpu" and native_cpu_bf16 and cpu_bf16():
        name, why = "bf16", "auto: the CPU has native bf16 (AMX/AVX512-BF16)"
    elif dev.type == "cpu" and native_cpu_bf16:
        name, why = "off", "auto: off on a CPU without native bf16 (AVX512-BF16/AMX), where bf16 runs many times slower"
    else:
        name, why = "off", f"auto: off on {dev.type}"
    return AmpSpec(name, _DTYPES[name], name != "off", dev.type, why)


def make_scaler(amp: AmpSpec) -> torch.amp.GradScaler:
    """A GradScaler, enabled for fp16 only (a disabled one passes the loss and the step through)."""
    return torch.amp.GradScaler(amp.device_type, enabled=amp.name == "fp16")


def seed_everything(seed: int, *, deterministic: bool) -> None:
    """Seed Python, NumPy and torch (same on every rank: identical initial weights); pick kernels.

    ``deterministic`` asks for deterministic algorithms (bit-identical reruns and resumes);
    otherwise cuDNN may autotune.
    """
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS needs it for determinism
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
    else:
        torch.backends.cudnn.benchmark = True
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


# --------------------------------------------------------------------------- distributed


@dataclass
class Dist:
    """This process's place in a DDP run (``world_size == 1``: not distributed)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    owned: bool = False  # we called init_process_group (so we destroy it)

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def main(self) -> bool:
        return self.rank == 0


def init_distributed(device: torch.device) -> Dist:
    """Join the process group torchrun describes (``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``).

    nccl on GPU, gloo on CPU; a group someone else started is used as it is.
    """
    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist()
    rank = int(os.environ["RANK"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    owned = False
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
        owned = True
    return Dist(rank, world, local, owned)


def shutdown_distributed(d: Dist) -> None:
    """Destroy the process group if :func:`init_distributed` created it."""
    if d.owned:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def all_reduce_sum(t: torch.Tensor, d: Dist) -> torch.Tensor:
    """Sum ``t`` over the ranks in place (nothing to do in one process)."""
    if d.enabled:
        import torch.distributed as dist

        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def broadcast_buffers(model: nn.Module, d: Dist) -> None:
    """Give every rank rank 0's BatchNorm statistics (each rank updated its own since DDP's last sync)."""
    if d.enabled:
        import torch.distributed as dist

        for b in model.buffers():
            dist.broadcast(b, 0)


def wrap_ddp(model: nn.Module, d: Dist, device: torch.device) -> nn.Module:
    """``model`` in DistributedDataParallel when the run is distributed, else ``model`` itself."""
    if not d.enabled:
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP

    return DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
