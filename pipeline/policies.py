"""Sampling policies: how a Loader draws a source's samples, each a class in one registry.

=============  ===========  ====================================================================
role           names        what it makes
=============  ===========  ====================================================================
``shuffle``    ``global``,  the order over one split (``Loader(path, shuffle=NAME)``): a
               ``block``    :class:`~.order.SampleOrder` (share, positions, windows, state)
``mix``        ``mix``      the order over several splits (``Loader([a, b], weights=...)``,
                            :mod:`.mixsource`)
``balance``    ``classes``, a split's groups inside a mix's or a balanced split's plan
               ``weights``  (``balance=NAME``): members, group sizes and weights
=============  ===========  ====================================================================

A policy of one's own is one class and one :func:`register_policy` (or a
``stoker.sampling_policies`` entry point): ``shuffle=`` then takes its name
(``tests/pipeline/test_sampling_policies.py`` registers one from the test and reads through it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from stoker.errors import ArgumentError

from . import order
from .registry import Registry

ROLES = ("shuffle", "mix", "balance")


class SamplingPolicy:
    """A sampling policy (the base of every one): its :attr:`name` and :attr:`role` (which Loader
    argument chooses it). A ``shuffle`` policy defines :meth:`order`; a ``balance`` policy
    :meth:`groups` (and :meth:`by_length` where its groups are cut from the epoch length)."""

    name: ClassVar[str] = ""
    role: ClassVar[str] = "shuffle"

    def order(
        self, source: Any, options: Any, *, rank: int, world_size: int, train: bool, batch_size: int, drop_last: bool
    ) -> order.SampleOrder:
        """This rank's order over ``source``'s loadable samples (``source.index.valid_counts()``
        per shard); ``options`` is the Loader's :class:`~.options.Order`."""
        raise NotImplementedError

    def groups(self, value: Any, source: Any, quota: int) -> tuple:
        """A balance: ``(members, group sizes, group weights)`` of one split drawing ``quota``
        samples an epoch (``value``: what ``balance=`` was given)."""
        raise NotImplementedError

    def by_length(self, source: Any) -> str | None:
        """A balance whose groups are cut from the epoch length: a name that stands for them in a
        state's checksum; else ``None``."""
        return None


#: every sampling policy, by name
POLICIES: Registry[SamplingPolicy] = Registry(
    "sampling policy", SamplingPolicy, "stoker.sampling_policies", required=("name", "role")
)


def register_policy(cls: type[SamplingPolicy]) -> type[SamplingPolicy]:
    """Add a sampling policy (usable as a decorator); its :attr:`~SamplingPolicy.role` must be one of
    :data:`ROLES`."""
    if getattr(cls, "role", None) not in ROLES:
        raise ArgumentError(f"{cls!r}: a sampling policy's role is one of {ROLES}")
    return POLICIES.register(cls)


def policy_names(role: str) -> tuple[str, ...]:
    """The names of the policies of ``role`` (``"shuffle"``: what ``shuffle=`` takes)."""
    return tuple(c.name for c in POLICIES if c.role == role)


def get_policy(name: str, role: str) -> SamplingPolicy:
    """The policy ``name`` of ``role``, made (an unknown name is one line listing the known)."""
    cls = POLICIES.get(name)
    if cls is None or cls.role != role:
        raise ArgumentError(f"{role}={name!r} must be one of {policy_names(role)}")
    return cls()


@register_policy
class GlobalPolicy(SamplingPolicy):
    """``shuffle="global"``: a fresh permutation of the whole split each epoch (:class:`~.order.GlobalOrder`)."""

    name = "global"

    def order(self, source, options, **kw):
        return order.GlobalOrder(source.index.valid_counts(), **kw)


@register_policy
class BlockPolicy(SamplingPolicy):
    """``shuffle="block"``: shard blocks and windows (:class:`~.order.BlockOrder`)."""

    name = "block"

    def order(self, source, options, **kw):
        return order.BlockOrder(source.index.valid_counts(), block_shards=options.block_shards, **kw)


def class_weights(value: Any, num_classes: int, where: Any) -> np.ndarray:
    """``balance="classes"`` (each class alike) or ``{class_index: weight}`` as a weight per class."""
    if value == "classes":
        return np.ones(num_classes)
    w = np.zeros(num_classes)
    for c, v in value.items():
        if isinstance(c, bool) or not isinstance(c, (int, np.integer)) or not 0 <= c < num_classes:
            raise ArgumentError(f"balance={{{c!r}: ...}}: a class index of {where} is 0 .. {num_classes - 1}")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0 or v == float("inf"):
            raise ArgumentError(f"balance={{{c}: {v!r}}}: a weight must be a finite number >= 0")
        w[c] = v
    return w


@register_policy
class ClassesBalance(SamplingPolicy):
    """``balance="classes"`` (or ``{class_index: weight}``): each group the split's kind makes
    (``Target.balance_groups``: classes, rarest labels) its share of the split's quota."""

    name, role = "classes", "balance"

    def groups(self, value, source, quota):
        from .balance_tables import ClassSlots, class_members
        from .shards.kinds import kinds

        target = source.index.target
        if target.balance_groups is None:
            able = " or ".join(k.name for k in kinds() if k.balance_groups)
            raise ArgumentError(
                f"balance={value!r} balances a split of {able} targets; {source.path} is a {target.kind} split "
                "(balance='weights' draws any kind by its packed per-sample weights)"
            )
        slots = ClassSlots(*class_members(source.index))
        weights = class_weights(value, len(source.index.manifest.classes), source.path)
        # groups past the classes (a multi-label split's samples with no label): never drawn
        return slots, slots.counts(), np.append(weights, np.zeros(len(slots.counts()) - len(weights)))


@register_policy
class WeightsBalance(SamplingPolicy):
    """``balance="weights"``: each sample its share of the split's quota by its packed weight
    (:mod:`.sampleweights`)."""

    name, role = "weights", "balance"

    def groups(self, value, source, quota):
        from .sampleweights import weight_slots

        return weight_slots(source.index, quota)

    def by_length(self, source):
        from .shards.table import manifest_digest

        return f"weights {manifest_digest(Path(source.index.split_dir)).hex()[:16]}"


def balance_policy(value: Any) -> SamplingPolicy:
    """The balance policy ``balance=value`` names (a dict: class weights, ``"classes"``)."""
    return get_policy("classes" if isinstance(value, dict) else value, "balance")


__all__ = [
    "POLICIES",
    "ROLES",
    "BlockPolicy",
    "ClassesBalance",
    "GlobalPolicy",
    "SamplingPolicy",
    "WeightsBalance",
    "balance_policy",
    "class_weights",
    "get_policy",
    "policy_names",
    "register_policy",
]
