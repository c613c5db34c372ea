"""Training checkpoints: atomic, self-checking, loaded without unpickling code.

A checkpoint is a plain ``torch.save`` dict (``torch.load(path, weights_only=True)``
reads it anywhere) holding ``model`` (the state_dict), ``optimizer``, ``scaler``,
``scheduler``, ``loader`` (the Loader's resume state), ``rng``, ``config``, ``epoch``,
``step`` and a ``digest``: a sha256 over every tensor's bytes and every value, because
``torch.load`` does not check the zip CRCs (a flipped byte inside a tensor loads
silently). Files are written to a temp file and renamed, so a crash or ``kill -9``
never leaves a half-written checkpoint.
"""

from __future__ import annotations

import hashlib
import os
import random
import signal
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Union

import numpy as np
import torch

from stoker.errors import CheckpointError, one_line
from stoker.pipeline.fsutil import atomic_write

FORMAT = "stoker-checkpoint"
VERSION = 1

PathLike = Union[str, "os.PathLike[str]"]


def _feed(h: hashlib._Hash, obj: Any) -> None:
    """Hash ``obj`` canonically (type-tagged, dict keys in a stable order)."""
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)};".encode())
        if t.numel():
            h.update(t.reshape(-1).view(torch.uint8).numpy())
    elif isinstance(obj, Mapping):
        h.update(f"D{len(obj)};".encode())
        for k in sorted(obj, key=lambda k: (type(k).__name__, repr(k))):
            _feed(h, k)
            _feed(h, obj[k])
    elif isinstance(obj, (list, tuple)):
        h.update(f"{'L' if isinstance(obj, list) else 'U'}{len(obj)};".encode())
        for v in obj:
            _feed(h, v)
    elif obj is None or isinstance(obj, (bool, int, float, str, bytes, torch.dtype, torch.device, torch.Size)):
        h.update(f"{type(obj).__name__}:{obj!r};".encode())
    else:
        raise TypeError(f"checkpoint value of type {type(obj).__name__} is not plain data")


def digest(state: Mapping[str, Any]) -> str:
    """sha256 of everything in ``state`` except its ``digest`` entry."""
    h = hashlib.sha256()
    _feed(h, {k: v for k, v in state.items() if k != "digest"})
    return h.hexdigest()


def weights_digest(model: torch.nn.Module) -> str:
    """sha256 over the state_dict tensors (names, dtypes, shapes, bytes): equal digests = equal weights."""
    return digest(model.state_dict())


def save_checkpoint(path: PathLike, state: Mapping[str, Any]) -> Path:
    """Write ``state`` (plain data and tensors) to ``path`` atomically, with its digest.

    Tensors are moved to the CPU first so the file loads on any machine.
    """
    path = Path(path)
    obj = {"format": FORMAT, "version": VERSION, **_to_cpu(dict(state))}
    obj["digest"] = digest(obj)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path, "wb") as f:
        torch.save(obj, f)
    return path


def _to_cpu(obj: Any, seen: dict | None = None) -> Any:
    """``obj`` with its tensors on the CPU; a tensor met twice (the model's and the bare network's
    state_dict share their tensors) is copied once, so torch.save stores it once."""
    seen = {} if seen is None else seen
    if isinstance(obj, torch.Tensor):
        key = (obj.device, obj.data_ptr(), obj.dtype, tuple(obj.shape), obj.stride())
        if key not in seen:
            seen[key] = obj.detach().cpu()
        return seen[key]
    if isinstance(obj, dict):
        return {k: _to_cpu(v, seen) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to_cpu(v, seen) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_to_cpu(v, seen) for v in obj)
    if isinstance(obj, str) and type(obj) is not str:
        return str(obj)  # e.g. torch.__version__ (TorchVersion): weights_only refuses the subclass
    return obj


def load_checkpoint(path: PathLike, *, arch: str | None = None, num_outputs: int | None = None) -> dict[str, Any]:
    """Read and verify a checkpoint (on the CPU) without executing pickled code.

    Args:
        path: The ``.pt`` file.
        arch: When given, the checkpoint must be for this architecture.
        num_outputs: When given, the checkpoint's head must have this many outputs.

    Raises:
        CheckpointError: Missing, unreadable, not a stoker checkpoint, digest mismatch
            (tampered or corrupt), or for a different architecture. The message is one line.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # boundary: torch.load of the user's file: raised as one CheckpointError naming it
        if "weights_only" in str(e) or "Unsupported global" in str(e):
            raise CheckpointError(
                f"{path}: refused: it holds pickled objects other than tensors and plain data "
                f"(loaded with weights_only=True)"
            ) from None
        raise CheckpointError(f"{path}: not a readable checkpoint ({one_line(e, with_type=True)})") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a stoker checkpoint (no '{FORMAT}' marker)")
    if state.get("version") != VERSION:
        raise CheckpointError(
            f"{path}: checkpoint version {state.get('version')!r} is not supported (expected {VERSION})"
        )
    try:
        ok = state.get("digest") == digest(state)
    except TypeError as e:
        raise CheckpointError(f"{path}: unexpected content ({one_line(e, with_type=True)})") from None
    if not ok:
        raise CheckpointError(f"{path}: digest mismatch: the file was modified or corrupted after it was written")
    cfg = state.get("config") or {}
    if arch is not None and cfg.get("arch") != arch:
        raise CheckpointError(f"{path}: checkpoint is for arch {cfg.get('arch')!r}, this run uses {arch!r}")
    if num_outputs is not None and cfg.get("num_outputs") not in (None, num_outputs):
        raise CheckpointError(f"{path}: checkpoint has {cfg.get('num_outputs')} outputs, this run needs {num_outputs}")
    return state


def load_model_state(
    model: torch.nn.Module, state_dict: Mapping[str, torch.Tensor], *, source: str = "checkpoint"
) -> None:
    """``model.load_state_dict(strict=True)`` with a one-line :class:`CheckpointError` on mismatch."""
    own = model.state_dict()
    missing = [k for k in own if k not in state_dict]
    unexpected = [k for k in state_dict if k not in own]
    shapes = [k for k in own if k in state_dict and tuple(own[k].shape) != tuple(state_dict[k].shape)]
    if missing or unexpected or shapes:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing keys (e.g. {missing[0]})")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected keys (e.g. {unexpected[0]})")
        if shapes:
            k = shapes[0]
            parts.append(
                f"{len(shapes)} shape mismatches (e.g. {k}: {tuple(state_dict[k].shape)} vs {tuple(own[k].shape)})"
            )
        raise CheckpointError(f"{source}: does not fit this model (a different architecture?): {'; '.join(parts)}")
    model.load_state_dict(state_dict, strict=True)


# --- RNG states as plain data (weights_only-loadable: no numpy arrays, no tuples of objects)


def rng_state() -> dict[str, Any]:
    """Python, NumPy, torch CPU and CUDA generator states."""
    py = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    return {
        "python": {"version": py[0], "state": list(py[1]), "gauss": py[2]},
        "numpy": {
            "name": np_name,
            "keys": torch.from_numpy(np_keys.astype(np.int64)),
            "pos": int(np_pos),
            "has_gauss": int(np_has_gauss),
            "gauss": float(np_gauss),
        },
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else [],
    }


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Restore what :func:`rng_state` captured (CUDA only when the device count matches)."""
    py = state["python"]
    random.setstate((py["version"], tuple(py["state"]), py["gauss"]))
    n = state["numpy"]
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda") or []
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)


class StopSignals:
    """Context manager: SIGTERM/SIGINT set :attr:`received` instead of killing the process.

    The training loop checks it after each step, writes a checkpoint and returns. A
    second SIGINT while one is pending raises ``KeyboardInterrupt`` (the impatient
    Ctrl-C still works). Outside the main thread it does nothing.
    """

    def __init__(self) -> None:
        self.received: int | None = None
        self._old: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        if self.received is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.received = signum

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGTERM, signal.SIGINT):
                self._old[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)
        self._old.clear()


# --- starting a new run from another's weights (fine-tuning: stoker train --init-from)


def read_weights(path: PathLike) -> dict[str, torch.Tensor]:
    """The tensors to start a run from: a stoker checkpoint's ``model``, or a state_dict file
    (torchvision's, timm's; a ``state_dict``/``model`` entry holding it is taken), read with
    ``weights_only=True``.

    Raises:
        CheckpointError: missing, unreadable, a damaged stoker checkpoint, or no tensors in it.
    """
    try:
        return dict(load_checkpoint(path)["model"])
    except CheckpointError as e:
        if "not a stoker checkpoint" not in str(e):
            raise
    state = torch.load(path, map_location="cpu", weights_only=True)  # load_checkpoint read it already
    for key in ("state_dict", "model"):
        if isinstance(state.get(key), Mapping):
            state = state[key]
            break
    tensors = {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}
    if not tensors:
        raise CheckpointError(f"{path}: holds no tensors to start from")
    return tensors


def _names(names: list[str], limit: int = 3) -> str:
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


class WeightsMatch:
    """What :func:`load_matching` loaded: ``loaded`` names, ``reshaped`` ``(name, theirs, ours)``
    shapes that differ, ``absent`` names the source lacks."""

    def __init__(self, loaded: list[str], reshaped: list[tuple[str, tuple, tuple]], absent: list[str]) -> None:
        self.loaded, self.reshaped, self.absent = loaded, reshaped, absent

    def describe(self) -> str:
        """``118 of 120 tensors loaded; 2 skipped, shapes differ: net.fc.weight (6, 384) -> (3, 384), ...``."""
        total = len(self.loaded) + len(self.reshaped) + len(self.absent)
        parts = [f"{len(self.loaded)} of {total} tensors loaded"]
        if self.reshaped:
            shapes = [f"{n} {tuple(a)} -> {tuple(b)}" for n, a, b in self.reshaped]
            parts.append(f"{len(self.reshaped)} skipped, shapes differ: {_names(shapes, 2)}")
        if self.absent:
            parts.append(f"{len(self.absent)} not in the checkpoint: {_names(self.absent)}")
        return "; ".join(parts)

    def as_dict(self) -> dict[str, Any]:
        return {"loaded": len(self.loaded), "reshaped": [n for n, _, _ in self.reshaped], "absent": self.absent}


def load_matching(model: torch.nn.Module, tensors: Mapping[str, torch.Tensor], *, prefix: str = "net.") -> WeightsMatch:
    """Load into ``model``'s tensors under ``prefix`` (the network, not this run's normalization)
    those of ``tensors`` with the same name and shape; a name is also looked up without ``prefix``
    (a bare network's state_dict) and with DDP's ``module.``. The rest keep their initial values."""
    own = model.state_dict()
    take, loaded, reshaped, absent = {}, [], [], []
    for name, mine in own.items():
        if not name.startswith(prefix):
            continue
        bare = name[len(prefix) :]
        theirs = next((tensors[k] for k in (name, bare, "module." + bare) if k in tensors), None)
        if theirs is None:
            absent.append(name)
        elif tuple(theirs.shape) != tuple(mine.shape):
            reshaped.append((name, tuple(theirs.shape), tuple(mine.shape)))
        else:
            take[name] = theirs
            loaded.append(name)
    model.load_state_dict(take, strict=False)
    return WeightsMatch(loaded, reshaped, absent)
