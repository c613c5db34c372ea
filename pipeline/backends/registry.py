"""The decode backends, each describing itself, in one registry every choice and name list asks.

A backend says its ``name``, where it decodes (``where``: the CPU, the GPU), whether it can run on
a device here and why (:meth:`Backend.available`), how it resolves ``decode=``, its runner and the
runner's options. ``Loader(backend=...)`` takes a name or a configured backend
(``get_backend("nvjpeg", overlap=False)``); ``"auto"`` is the first backend, by ``priority``, that
can run here (:func:`resolve_backend`: what the Loader, ``stoker diagnose`` and ``stoker
gpu-check`` all use). A backend of your own is a subclass registered once::

    class MyBackend(Backend):
        name, where, priority = "mine", ("cpu",), 50
        summary = "my decoder"

        def runner_class(self):
            return MyRunner          # MyRunner(settings, **options): iterate(batches, epoch, seed), close()

    register_backend(MyBackend)

Its name is then a ``Loader(backend=)`` value and a ``--backend`` choice of every command (in
other processes too when a package names it under the ``stoker.backends`` entry points).
"""

from __future__ import annotations

import importlib
from typing import Any, ClassVar

from stoker.errors import ArgumentError
from stoker.pipeline.registry import Registry

#: what ``decode=`` may say (``auto``: where the backend decodes best on the device)
DECODES = ("auto", "mixed", "cpu")


class Backend:
    """A decode backend: its description, its rules, and its runner (made per Loader).

    Attributes:
        name: the ``backend=`` value.
        summary: one line for help texts.
        where: where it decodes: ``"cpu"``, ``"gpu"`` (or both).
        priority: ``backend="auto"`` tries backends in this order (lowest first).
        option_names: the options its runner takes (``Backend(**options)``).
        options: this configuration's options.
    """

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    where: ClassVar[tuple[str, ...]] = ("cpu",)
    priority: ClassVar[int] = 100
    option_names: ClassVar[tuple[str, ...]] = ()

    def __init__(self, **options: Any) -> None:
        unknown = sorted(set(options) - set(self.option_names))
        if unknown:
            takes = ", ".join(self.option_names) or "none"
            raise ArgumentError(f"backend {self.name!r} has no option {unknown[0]!r} (its options: {takes})")
        self.options = dict(options)

    def with_options(self, **options: Any) -> Backend:
        """This backend with ``options`` added (a new object)."""
        return type(self)(**{**self.options, **options})

    def available(self, device: str, *, decoder: str | None = None) -> tuple[bool, str]:
        """``(can run with batches on device, why)``; never raises. ``device``: ``"cpu"``,
        ``"cuda"`` or ``"cuda:N"``; ``decoder``: the GPU JPEG decoder asked for (nvjpeg's)."""
        on_gpu = device.split(":", 1)[0] == "cuda"
        if "cpu" not in self.where and not on_gpu:
            return False, f"{self.name} decodes on the GPU and the device is the CPU"
        return True, ""

    def refusal(self, device: str, why: str, *, decoder: str | None = None) -> str:
        """The one-line error of ``backend=<name>`` asked for where it cannot run (``why``: what
        :meth:`available` said), naming the fix."""
        return f"backend={self.name!r} cannot run here: {why}"

    def resolve_decode(self, decode: str, device: Any) -> str:
        """``"mixed"`` (GPU decode) or ``"cpu"`` for ``decode`` on ``device`` (a ``torch.device``):
        ``auto`` is mixed where this backend can decode on a CUDA device; impossible pairs refused."""
        gpu = device.type == "cuda"
        if decode == "auto":
            decode = "mixed" if gpu and "gpu" in self.where else "cpu"
        if decode == "mixed" and "gpu" not in self.where:
            others = [b.name for b in backends() if "gpu" in b.where]
            raise ArgumentError(f"decode='mixed' needs backend={' or '.join(map(repr, others))}")
        if decode == "cpu" and "cpu" not in self.where:
            raise ArgumentError(
                f"backend={self.name!r} decodes on the GPU: use decode='auto' (or 'mixed'), "
                f"or backend={'/'.join(repr(b.name) for b in backends() if 'cpu' in b.where)} for CPU decode"
            )
        if decode == "mixed" and not gpu:
            raise ArgumentError(
                f"decode='mixed' decodes on the GPU but device={str(device)!r}: use device='cuda' or decode='cpu'"
            )
        return decode

    def runner_class(self) -> type:
        """The runner: ``Runner(settings, **options)`` (:class:`~.base.Runner`)."""
        raise NotImplementedError

    def make_runner(self, settings: Any) -> Any:
        """This configuration's runner for a Loader's :class:`~.base.DecodeSettings`."""
        return self.runner_class()(settings, **self.options)

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in self.options.items())
        return f"{type(self).__name__}({opts})"


def _decoders():
    """The nvjpeg backend's decoder probes (:mod:`.decoders`; numpy and pillow behind it): imported
    when a choice needs them, so listing the backends stays cheap."""
    from . import decoders

    return decoders


class _Builtin(Backend):
    """A backend of this package: its runner imported on first use (an unused backend's
    dependencies are never loaded)."""

    runner_path: ClassVar[tuple[str, str]] = ("", "")

    def runner_class(self) -> type:
        module, name = self.runner_path
        return getattr(importlib.import_module(module, __package__), name)


class DaliBackend(_Builtin):
    name, priority, where = "dali", 0, ("cpu", "gpu")
    summary = "NVIDIA DALI: GPU (mixed) decode on CUDA, its CPU graph otherwise"
    runner_path = (".dali", "DaliRunner")

    def available(self, device, *, decoder=None):
        from .. import deps

        if not deps.HAS_DALI:
            return False, "nvidia-dali is not installed"
        on_gpu = device.split(":", 1)[0] == "cuda"
        return True, "nvidia-dali is installed; " + (
            "it decodes on the GPU" if on_gpu else "its CPU decode is the fastest CPU path"
        )

    def refusal(self, device, why, *, decoder=None):
        return f"backend='dali' but {why} (pip install nvidia-dali-cuda120, or use backend='pil')"


class NvjpegBackend(_Builtin):
    name, priority, where = "nvjpeg", 10, ("gpu",)
    summary = "batched GPU JPEG decode without DALI (nvImageCodec, TorchCodec or torchvision)"
    runner_path = (".nvjpeg", "NvjpegRunner")
    option_names = ("decoder", "overlap", "region", "hw_decoder_load", "stage_sync")

    def available(self, device, *, decoder=None):
        from .. import deps

        ok, why = super().available(device)
        if not ok:
            return False, "the device is the CPU"
        if not deps.has_cuda():
            return False, "torch sees no CUDA device"
        works, why = _decoders().gpu_decode(device, decoder)
        if not works:
            which = "torchvision's GPU decode does not" if decoder is None else "no GPU JPEG decoder does"
            return False, f"{which} work here ({why})"
        return True, why

    def refusal(self, device, why, *, decoder=None):

        if why == "the device is the CPU":
            return "backend='nvjpeg' decodes on the GPU but the device is the CPU: use device='cuda', or backend='pil'"
        if why == "torch sees no CUDA device":
            return "backend='nvjpeg' but torch sees no CUDA device (use backend='pil' and device='cpu')"
        which = "torchvision" if decoder is None else f"decoder={decoder!r}"
        probe = _decoders().gpu_decode(device, decoder)[1]  # cached: what the choice saw
        return f"backend='nvjpeg' but {which} cannot decode JPEGs on this GPU ({probe}); use backend='pil'"


class PilBackend(_Builtin):
    name, priority, where = "pil", 20, ("cpu",)
    summary = "pillow(-simd) in worker processes"
    runner_path = (".pil", "PilRunner")


#: the entry-point group a package names its backends in (``[project.entry-points."stoker.backends"]
#: mine = "mypkg.decode:MyBackend"``): registered the first time the registry is asked
ENTRY_POINTS = "stoker.backends"
_REGISTRY: Registry[Backend] = Registry("backend", Backend, ENTRY_POINTS, reserved=("auto",))


def register_backend(cls: type[Backend]) -> type[Backend]:
    """Add a backend class (usable as a decorator). Its name must be new and not ``"auto"``."""
    return _REGISTRY.register(cls)


for _cls in (DaliBackend, NvjpegBackend, PilBackend):
    register_backend(_cls)


def backends() -> list[Backend]:
    """One (unconfigured) instance of every registered backend, in ``auto``'s order."""
    return [cls() for cls in sorted(_REGISTRY, key=lambda c: (c.priority, c.name))]


def backend_names(*, auto: bool = True) -> tuple[str, ...]:
    """The ``backend=`` values (``"auto"`` first): every CLI choice list derives from it."""
    return (("auto",) if auto else ()) + tuple(b.name for b in backends())


def get_backend(name: str, **options: Any) -> Backend:
    """The backend ``name``, configured with ``options``.

    Raises:
        ValueError: an unknown name (the message lists the registered ones) or option.
    """
    cls = _REGISTRY.get(name)
    if cls is None:
        raise ArgumentError(f"backend={name!r} must be one of {', '.join(map(repr, backend_names(auto=False)))}")
    return cls(**options)


def runner_class(backend: str) -> type:
    """The runner class of ``backend`` (a registered name), imported on demand."""
    return get_backend(backend).runner_class()


def resolve_backend(requested: str | Backend, device: Any, decoder: str | None = None) -> tuple[Backend, str]:
    """The backend for ``requested`` with batches on ``device`` (``"cpu"``, ``"cuda"``, ``"cuda:N"``
    or a ``torch.device``), and why: ``(configured backend, reason)``.

    ``"auto"`` is the first backend by priority that can run here (DALI when installed; else a GPU
    JPEG decoder on a CUDA device; else pillow); the reason says why each earlier one could not.
    ``decoder`` is the nvjpeg backend's (:func:`stoker.pipeline.backends.decoders.resolve_decoder`; ``None``:
    torchvision's probe alone). The Loader, ``stoker diagnose`` and ``stoker gpu-check`` all
    choose here, with the Loader's ``decoder`` (``"auto"`` by default).

    Raises:
        ValueError: an unknown name or decoder, or an explicit backend that cannot run here (the
            message names the fix).
    """

    device = str(device)
    if device.split(":", 1)[0] not in ("cpu", "cuda"):
        raise ArgumentError(f"device {device!r}: only 'cpu' and 'cuda' are supported")
    if decoder is not None and decoder not in _decoders().DECODER_NAMES:
        raise ArgumentError(f"decoder={decoder!r} must be one of {_decoders().DECODER_NAMES}")
    if isinstance(requested, Backend) or requested != "auto":
        if not isinstance(requested, Backend) and requested not in backend_names():
            raise ArgumentError(f"backend={requested!r} must be one of {backend_names()}")
        backend = requested if isinstance(requested, Backend) else get_backend(requested)
        ok, why = backend.available(device, decoder=decoder)
        if not ok:
            raise ArgumentError(backend.refusal(device, why, decoder=decoder))
        return backend, "requested"
    skipped = []
    for backend in backends():
        ok, why = backend.available(device, decoder=decoder)
        if ok:
            return backend, "; ".join([*skipped, why] if why else skipped) or f"{backend.name} runs here"
        skipped.append(why)
    raise ArgumentError(f"no decode backend can run on {device}: {'; '.join(skipped)}")  # pragma: no cover - pil runs


__all__ = [
    "DECODES",
    "Backend",
    "DaliBackend",
    "NvjpegBackend",
    "PilBackend",
    "backend_names",
    "backends",
    "get_backend",
    "register_backend",
    "resolve_backend",
    "runner_class",
]
