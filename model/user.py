"""Your own network, named on the command line as ``FILE.py:FUNCTION`` or ``package.module:FUNCTION``.

``stoker train --model`` and ``stoker diagnose --model`` take the same spec: the file is imported
(its folder first on ``sys.path``, so its sibling imports work), the factory is called with the
arguments it accepts of ``num_classes``/``num_outputs`` (the outputs the task needs) and
``in_channels``/``in_chans`` (1 for grayscale), and the result must be a ``torch.nn.Module``.
Every way this can fail is one :class:`~stoker.errors.UsageError` line naming the spec.

>>> net = build_user_model("nets.py:make_net", num_outputs=1)   # doctest: +SKIP
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
from pathlib import Path

from torch import nn

from stoker.errors import UsageError, arg, one_line

#: the factory's argument names for the outputs and the input channels (first one it accepts wins)
OUTPUT_ARGS = ("num_classes", "num_outputs")
CHANNEL_ARGS = ("in_channels", "in_chans")


def resolve_spec(spec: str) -> str:
    """``spec`` with a file path made absolute (what a run's config records, so a resume or a
    ``Predictor`` from another folder finds the same file)."""
    modname, sep, attr = str(spec).rpartition(":")
    if sep and _is_file(modname):
        return f"{Path(modname).expanduser().resolve()}:{attr}"
    return str(spec)


def _is_file(modname: str) -> bool:
    return modname.endswith(".py") or os.sep in modname or "/" in modname


def load_factory(spec: str):
    """``module:factory`` or ``file.py:factory`` → the callable.

    Raises:
        UsageError: a malformed spec, a missing file or attribute, an import that fails (its first
            line), or an attribute that is not callable.
    """
    modname, sep, attr = str(spec).rpartition(":")
    if not sep or not modname or not attr:
        raise UsageError(f"{arg('model')} {spec!r} must look like 'package.module:factory' or 'file.py:factory'")
    try:
        if _is_file(modname):
            path = Path(modname).expanduser().resolve()
            if not path.is_file():
                raise UsageError(f"{arg('model')} {spec!r}: no such file {modname}")
            name = f"_stoker_user_model_{path.stem}"
            sys.path.insert(0, str(path.parent))  # so the file's own sibling imports work
            try:
                mspec = importlib.util.spec_from_file_location(name, path)
                module = importlib.util.module_from_spec(mspec)
                sys.modules[name] = module
                mspec.loader.exec_module(module)
            finally:
                sys.path.remove(str(path.parent))
        else:
            if "" not in sys.path and os.getcwd() not in sys.path:
                sys.path.insert(0, os.getcwd())  # like `python -m`: the current folder is importable
            module = importlib.import_module(modname)
    except UsageError:
        raise
    except BaseException as e:  # boundary: the user's module (even SystemExit), raised as one UsageError
        if isinstance(e, KeyboardInterrupt):
            raise
        msg = str(e).splitlines()[0] if str(e) else ""
        raise UsageError(f"{arg('model')} {spec!r}: cannot import {modname}: {type(e).__name__}: {msg}") from None
    if not hasattr(module, attr):
        raise UsageError(f"{arg('model')} {spec!r}: {modname} has no attribute {attr!r}")
    factory = getattr(module, attr)
    if not callable(factory):
        raise UsageError(f"{arg('model')} {spec!r}: {attr} is a {type(factory).__name__}, not a callable")
    return factory


def build_user_model(spec: str, num_outputs: int, *, in_channels: int = 3) -> nn.Module:
    """Import and call the ``--model`` factory (with the arguments it accepts of
    :data:`OUTPUT_ARGS` and :data:`CHANNEL_ARGS`); the result must be an ``nn.Module``.

    Raises:
        UsageError: the factory cannot be had, raises, or returns something else.
    """
    factory = load_factory(spec)
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        params = {}
    kwargs = {}
    for names, value in ((OUTPUT_ARGS, num_outputs), (CHANNEL_ARGS, in_channels)):
        name = next((n for n in names if n in params), None)
        if name is not None:
            kwargs[name] = value
    try:
        net = factory(**kwargs)
    except Exception as e:  # boundary: the user's factory, raised as one UsageError line
        msg = str(e).splitlines()[0] if str(e) else ""
        raise UsageError(f"{arg('model')} {spec!r}: the factory raised {type(e).__name__}: {msg}") from None
    if not isinstance(net, nn.Module):
        raise UsageError(f"{arg('model')} {spec!r}: the factory returned a {type(net).__name__}, not a torch.nn.Module")
    return net


def check_outputs(net: nn.Module, spec: str, *, num_outputs: int, in_channels: int, size: tuple[int, int], task: str):
    """Run ``net`` once on a zero batch of 2 (eval mode, no grad, on its device) and check its
    output's shape fits ``task``: ``[2, num_outputs]`` (``[2]`` too for one output), or
    ``[2, num_outputs, H, W]`` for ``segment``.

    Raises:
        UsageError: the forward fails or the shape does not fit, in one line naming the fix.
    """
    import torch

    param = next(net.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")
    x = torch.zeros((2, in_channels, *size), device=device)
    was_training = net.training
    net.eval()
    try:
        with torch.no_grad():
            out = net(x)
    except Exception as e:  # boundary: the user's network, raised as one UsageError line
        msg = one_line(e)
        raise UsageError(
            f"{arg('model')} {spec!r}: the network fails on a {list(x.shape)} batch ({type(e).__name__}: {msg}); "
            f"it gets {in_channels} channel(s) at {size[0]}x{size[1]} ({arg('crop')}, {arg('channels')})"
        ) from None
    finally:
        net.train(was_training)
    if isinstance(out, dict) and "out" in out:  # torchvision's segmentation models
        out = out["out"]
    shape = tuple(getattr(out, "shape", ()))
    want = (2, num_outputs, *size) if task == "segment" else (2, num_outputs)
    if shape == want or (task != "segment" and num_outputs == 1 and shape == (2,)):
        return
    keyword = "num_classes (or num_outputs)"
    raise UsageError(
        f"{arg('model')} {spec!r}: the network returns {list(shape)} for a batch of 2, the task ({task}) needs "
        f"{list(want)}: give the factory a {keyword} argument, or build it with {num_outputs} output(s)"
    )


#: what torch says when a forward ``.view()``s a tensor whose strides a view cannot keep (channels_last)
VIEW_STRIDE_ERROR = "view size is not compatible with input tensor's size and stride"


def channels_last_refusal(net: nn.Module, *, in_channels: int, size: tuple[int, int], name: str = "the network") -> str:
    """Why ``net`` cannot take channels_last batches, or ``""`` when it can.

    A forward that flattens with ``x.view(x.size(0), -1)`` (the seed report's network does) works
    on contiguous tensors only: a channels_last batch keeps its memory format through the
    convolutions, and the ``.view`` then fails. One forward on a zero batch of 2 in channels_last
    (eval mode, no grad, on the network's device) tells; any other failure is left to the run,
    which reports it in its own line.

    Returns:
        Why, for the caller's line (what it does instead and what that costs).
    """
    import torch

    param = next(net.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")
    x = torch.zeros((2, in_channels, *size), device=device).contiguous(memory_format=torch.channels_last)
    was_training = net.training
    net.eval()
    try:
        with torch.no_grad():
            net.to(memory_format=torch.channels_last)(x)
    except RuntimeError as e:
        if VIEW_STRIDE_ERROR not in str(e):
            return ""
        return f"{name}'s forward calls .view() on a tensor that channels_last leaves non-contiguous"
    except Exception:  # boundary: the user's network; its own failure is reported by the run itself
        return ""
    finally:
        net.to(memory_format=torch.contiguous_format)
        net.train(was_training)
    return ""


__all__ = [
    "CHANNEL_ARGS",
    "OUTPUT_ARGS",
    "VIEW_STRIDE_ERROR",
    "build_user_model",
    "channels_last_refusal",
    "check_outputs",
    "load_factory",
    "resolve_spec",
]
