"""The one registry behind the target kinds, the backends and the pack sources."""

import pytest

from stoker.errors import ArgumentError
from stoker.pipeline.registry import Registry


class Base:
    name = ""
    member = ""


class One(Base):
    name, member = "one", "x"


def _registry():
    return Registry("widget", Base, "stoker.test-widgets-none", required=("name", "member"), reserved=("auto",))


def test_register_get_names_and_the_one_error_type():
    r = _registry()
    assert r.register(One) is One and r.register(One) is One  # the same class again: a no-op
    assert r["one"] is One and r.get("two") is None and "one" in r and r.names() == ("one",) and list(r) == [One]
    with pytest.raises(ArgumentError, match=r"^widget 'two' is not one of one$"):
        r["two"]
    Other = type("Other", (Base,), {"name": "one", "member": "y"})
    with pytest.raises(ArgumentError, match=r"a widget named 'one' is already registered \(One\)"):
        r.register(Other)
    no_member = type("NoMember", (Base,), {"name": "z"})
    for bad in (object, no_member, type("Auto", (Base,), {"name": "auto", "member": "m"})):
        with pytest.raises(ArgumentError, match="is not a Base subclass with a name and a member of its own"):
            r.register(bad)


def test_a_copy_is_scratch_and_restore_puts_it_back():
    r = _registry()
    r.register(One)
    saved = r.copy()
    r.register(type("Two", (Base,), {"name": "two", "member": "m"}))
    assert saved.names() == ("one",) and r.names() == ("one", "two")
    r.restore(saved)
    assert r.names() == ("one",)


def test_a_broken_plugin_is_a_warning(monkeypatch):
    from importlib import metadata

    class EP:
        name, value = "bad", "nowhere:Nothing"

        def load(self):
            raise ImportError("no module named nowhere")

    monkeypatch.setattr(metadata, "entry_points", lambda group: [EP()] if group == "g" else [])
    r = Registry("widget", Base, "g")
    with pytest.warns(UserWarning, match=r"the widget plugin 'bad' \(nowhere:Nothing\) does not load: no module"):
        assert r.names() == ()
    assert r.names() == ()  # loaded once: said once
