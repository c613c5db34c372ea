"""The target kinds, each one class (its data and its behaviour) in one registry: every room asks
the kind, none switches on its name.

A split's target (:class:`Target`, what its manifest records) is an object of its kind's class: a
frozen dataclass of the fields (member, columns, classes, statistics) whose methods say how pack
encodes one value (:meth:`Target.encode`), how a batch of them is read for the Loader
(:meth:`~Target.decode`, or with its image for a spatial kind), how ``stoker verify`` and ``stoker
index`` check one (:meth:`~Target.check`, :meth:`~Target.index_value`), what statistics it keeps
(:meth:`~Target.accumulator`), how it is described in a summary (:meth:`~Target.summary`), what an
empty batch of it is, and which task ``stoker train --task auto`` trains on it (:attr:`~Target.task`).

A kind of your own is a subclass registered once (or named under the ``stoker.target_kinds``
entry points of your package)::

    @register_kind
    class Score(TargetKind):
        name, member, task = "score", "score.json", "regress"
        ...                                    # encode, decode, check, describe, accumulator

``Target(kind="score", ...)`` (or ``Target.from_json`` of its manifest) is then a ``Score``. The
built-in kinds: ``class`` (``cls``), ``float`` (``target.npy``), ``multilabel`` (``labels.npy``)
and ``mask`` (``mask.png``, spatial), and in a module of its own
(:mod:`stoker.pipeline.shards.boxes`, registered by :mod:`stoker.pipeline.shards.targets`)
``boxes`` (``boxes.npy``, follows the crop); their formats are in
:mod:`stoker.pipeline.shards.targets`.

One module a kind: :mod:`.classes`, :mod:`.floats`, :mod:`.multilabel`, :mod:`.mask` (registered here, in
the order ``--targets`` lists them), on :mod:`.base` (the :class:`Target` every kind derives from, the
shared codecs, the registry).
"""

from __future__ import annotations

from .base import (
    IGNORE_INDEX,
    MAX_COLUMNS,
    MAX_TARGET_BYTES,
    Target,
    TargetFields,
    TargetKind,
    bad_target,
    encode_float,
    encode_labels,
    encode_npy,
    ensure_kind,
    fast_float_reader,
    finite_number,
    get_kind,
    kind_names,
    kinds,
    parse_float,
    parse_labels,
    register_kind,
)
from .classes import ClassKind
from .floats import FloatKind, FloatStats
from .mask import MaskKind, MaskStats, check_mask
from .multilabel import MultilabelKind

for _cls in (ClassKind, FloatKind, MultilabelKind, MaskKind):  # this order: --targets' choices
    register_kind(_cls)

__all__ = [
    "IGNORE_INDEX",
    "MAX_COLUMNS",
    "MAX_TARGET_BYTES",
    "ClassKind",
    "FloatKind",
    "FloatStats",
    "MaskKind",
    "MaskStats",
    "MultilabelKind",
    "Target",
    "TargetFields",
    "TargetKind",
    "bad_target",
    "check_mask",
    "encode_float",
    "encode_labels",
    "encode_npy",
    "ensure_kind",
    "fast_float_reader",
    "finite_number",
    "get_kind",
    "kind_names",
    "kinds",
    "parse_float",
    "parse_labels",
    "register_kind",
]
