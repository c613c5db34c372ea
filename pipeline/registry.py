"""One registry for every extension point: named classes of one base, added by hand or named under
an entry-point group of an installed package (loaded the first time the registry is asked).

The target kinds (:mod:`.shards.kinds`), the decode backends (:mod:`.backends.registry`) and the
pack sources (:mod:`stoker.tools.pack.sources.registry`) are each one :class:`Registry`; their
modules keep their own ``register_*``/``get_*`` functions on top. A bad registration or an unknown
name is an :class:`~stoker.errors.ArgumentError` (a user's mistake: one line, exit 2)."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Generic, TypeVar

from stoker.errors import ArgumentError

T = TypeVar("T")


class Registry(Generic[T]):
    """Classes derived from ``base``, by their ``name``.

    Args:
        what: what one entry is, in words (``"target kind"``): messages name it.
        base: the class every entry derives from.
        group: the entry-point group a package names its entries in.
        required: the class attributes each entry must give a value of its own (``name`` first).
        reserved: names no entry may take (``"auto"``: a choice that picks one).
    """

    def __init__(
        self,
        what: str,
        base: type[T],
        group: str,
        *,
        required: tuple[str, ...] = ("name",),
        reserved: tuple[str, ...] = (),
    ):
        self.what, self.base, self.group = what, base, group
        self.required, self.reserved = required, reserved
        self._items: dict[str, type[T]] = {}
        self._plugins_loaded = False

    def register(self, cls: type[T]) -> type[T]:
        """Add ``cls`` (usable as a decorator); its name must be new (the same class again is a no-op).

        Raises:
            ArgumentError: not a subclass of the base with the required attributes, a reserved name,
                or a name another class holds.
        """
        if (
            not (isinstance(cls, type) and issubclass(cls, self.base))
            or not all(getattr(cls, a, None) for a in self.required)
            or cls.name in self.reserved
        ):
            attrs = " and ".join(f"a {a}" for a in self.required)
            raise ArgumentError(f"{cls!r} is not a {self.base.__name__} subclass with {attrs} of its own")
        held = self._items.get(cls.name)
        if held is not None and held is not cls:
            raise ArgumentError(f"a {self.what} named {cls.name!r} is already registered ({held.__name__})")
        self._items[cls.name] = cls
        return cls

    def load_plugins(self) -> None:
        """Register what installed packages name under :attr:`group` (once; a plugin that does not
        load is a warning, never an error: stoker runs without it)."""
        if self._plugins_loaded:
            return
        self._plugins_loaded = True
        from importlib.metadata import entry_points

        for ep in entry_points(group=self.group):
            try:
                self.register(ep.load())
            except Exception as e:  # noqa: BLE001 - boundary: a broken plugin is reported once (a warning), stoker goes on
                warnings.warn(
                    f"stoker: the {self.what} plugin {ep.name!r} ({ep.value}) does not load: {e}", stacklevel=3
                )

    def get(self, name: str) -> type[T] | None:
        """The class named ``name``, or None."""
        self.load_plugins()
        return self._items.get(name)

    def __getitem__(self, name: str) -> type[T]:
        """The class named ``name``.

        Raises:
            ArgumentError: an unknown name (the message lists the registered ones).
        """
        cls = self.get(name)
        if cls is None:
            raise ArgumentError(f"{self.what} {name!r} is not one of {', '.join(self._items)}")
        return cls

    def __contains__(self, name: object) -> bool:
        self.load_plugins()
        return name in self._items

    def __iter__(self) -> Iterator[type[T]]:
        """The classes, in the order they were registered."""
        self.load_plugins()
        return iter(list(self._items.values()))

    def names(self) -> tuple[str, ...]:
        """The registered names, in the order they were registered."""
        self.load_plugins()
        return tuple(self._items)

    def copy(self) -> Registry[T]:
        """A registry holding what this one holds now (a test's or a page's scratch copy)."""
        other = Registry(self.what, self.base, self.group, required=self.required, reserved=self.reserved)
        other._items, other._plugins_loaded = dict(self._items), self._plugins_loaded
        return other

    def restore(self, saved: Registry[T]) -> None:
        """Hold again what ``saved`` (a :meth:`copy`) held."""
        self._items, self._plugins_loaded = dict(saved._items), saved._plugins_loaded


__all__ = ["Registry"]
