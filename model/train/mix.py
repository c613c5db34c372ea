"""A run over a mix of datasets and with balanced classes: ``stoker train DATA --mix
web:0.7,curated:0.3 --balance classes``.

Each name of ``--mix`` is a dataset root (``DATA/NAME``, or an absolute path or a URL) holding
``train/`` and optionally ``val/``. The train Loader reads the train splits in those proportions
(``Loader([...], weights=..., balance=...)``, :mod:`stoker.pipeline.mixsource`); validation reads
each split's val whole, one Loader per split (:class:`SplitVals`), and reports each split's figures
beside the overall ones (:func:`~.evaluation.evaluate`: ``val["splits"]``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from stoker.errors import ArgumentError, arg

#: what ``--balance`` takes
BALANCE_CHOICES = ("classes", "weights")


def parse_mix(text: str) -> list[tuple[str, float]]:
    """``"web:0.7,curated:0.3"`` as ``[("web", 0.7), ("curated", 0.3)]`` (a name without a weight
    weighs 1); a bad entry is one line naming it."""
    out = []
    for entry in str(text).split(","):
        name, sep, weight = entry.strip().rpartition(":")
        if not sep or "://" in weight or "/" in weight:  # no weight given (a URL's colon is not one)
            name, weight = entry.strip(), "1"
        try:
            w = float(weight)
        except ValueError:
            w = -1.0
        if not name or not w >= 0 or w == float("inf"):
            raise ArgumentError(f"{arg('mix', text)}: {entry.strip()!r} is not NAME:WEIGHT (a weight >= 0)")
        out.append((name, w))
    if not sum(w for _, w in out):
        raise ArgumentError(f"{arg('mix', text)}: at least one weight must be above 0")
    names = [n for n, _ in out]
    if len(set(names)) != len(names):
        raise ArgumentError(f"{arg('mix', text)} names a dataset twice")
    return out


class MixPaths(str):
    """The splits of a mix, one of each dataset (``.paths``, ``.names``, ``.weights``); as a string
    it is the first one, whose manifest names the run's task and classes (the Loader checks that
    the others agree)."""

    paths: list
    names: list
    weights: list

    def __new__(cls, paths: list, names: list, weights: list) -> MixPaths:
        made = super().__new__(cls, paths[0])
        made.paths, made.names, made.weights = list(paths), list(names), list(weights)
        return made


def _nearest(root: Path) -> str:
    """``": did you mean curated?"``: the dataset beside ``root`` (a folder holding ``train/``) whose
    name is closest to its name (a typo in ``--mix``), or ``""`` when none is close."""
    from stoker.errors import close_names

    parent = root.parent
    try:
        names = sorted(d.name for d in parent.iterdir() if (d / "train").is_dir())
    except OSError:
        return ""
    close = close_names(root.name, names)
    return f": did you mean {' or '.join(close)}?" if close else ""


def mix_split_dirs(cfg: Any) -> tuple[MixPaths, MixPaths]:
    """``(train splits, val splits)`` of ``cfg.mix`` (each dataset's ``train/`` and ``val/``); a local
    dataset without ``train/`` is a FileNotFoundError naming it."""
    from stoker.pipeline.storage import is_url

    entries = parse_mix(cfg.mix)
    roots = []
    for name, _ in entries:
        if is_url(name):
            roots.append(name.rstrip("/"))
            continue
        root = Path(name) if Path(name).is_absolute() else Path(cfg.data) / name
        if not (root / "train").is_dir():
            raise FileNotFoundError(
                f"{arg('mix')} {name}: no {root / 'train'} (each dataset holds train/ and val/){_nearest(root)}"
            )
        roots.append(str(root))
    names, weights = [n for n, _ in entries], [w for _, w in entries]
    return (
        MixPaths([f"{r}/train" for r in roots], names, weights),
        MixPaths([f"{r}/val" for r in roots], names, weights),
    )


def train_source(train_dir: str) -> Any:
    """What the train Loader reads: the splits of a mix (a list), or the one split."""
    return list(train_dir.paths) if isinstance(train_dir, MixPaths) else train_dir


def mix_options(cfg: Any, train_dir: str) -> dict:
    """The train Loader's ``weights=``, ``balance=`` and ``epoch_length=`` from the run's settings."""
    out: dict[str, Any] = {}
    if isinstance(train_dir, MixPaths):
        out["weights"] = train_dir.weights
    if cfg.balance:
        out["balance"] = cfg.balance
    if cfg.epoch_length:
        out["epoch_length"] = cfg.epoch_length
    return out


def check_mix_settings(cfg: Any) -> None:
    """The run's mix settings, checked before any I/O (one line naming the bad one)."""
    if cfg.mix:
        parse_mix(cfg.mix)
    if cfg.balance is not None and cfg.balance not in BALANCE_CHOICES:
        raise ArgumentError(f"{arg('balance', cfg.balance)} must be one of {', '.join(BALANCE_CHOICES)}")
    if cfg.epoch_length is not None and cfg.epoch_length < 1:
        raise ArgumentError(f"{arg('epoch_length', cfg.epoch_length)} must be >= 1")


class SplitVals:
    """The val Loaders of a mix, one per dataset with a val split: ``(name, loader)`` pairs."""

    def __init__(self, loaders: list[tuple[str, Any]]):
        self.loaders = loaders

    def set_epoch(self, epoch: int) -> None:
        for _, loader in self.loaders:
            loader.set_epoch(epoch)

    def __len__(self) -> int:
        return sum(len(loader) for _, loader in self.loaders)


def open_val(factory: Callable[..., Any], val_dir: str, exists: Callable[[str], bool], **kw: Any) -> Any:
    """The val Loader of ``val_dir`` (``None`` without a val split), or for a mix, the
    :class:`SplitVals` of the datasets that have one (``None`` when none has)."""
    if not isinstance(val_dir, MixPaths):
        return factory(val_dir, **kw) if exists(val_dir) else None
    loaders = [(n, factory(p, **kw)) for n, p in zip(val_dir.names, val_dir.paths, strict=True) if exists(p)]
    return SplitVals(loaders) if loaders else None


__all__ = [
    "BALANCE_CHOICES",
    "MixPaths",
    "SplitVals",
    "check_mix_settings",
    "mix_options",
    "mix_split_dirs",
    "open_val",
    "parse_mix",
    "train_source",
]
