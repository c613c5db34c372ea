"""``stoker train --resume`` without repeating the flags: the run's own settings from
``RUN/config.json``, and the flags given on this command line over them.

A flag is "given" when it is on the command line, whatever its value (``--epochs 5`` where 5 is
the default still extends a 1-epoch run): :func:`note_given_flags` makes the parser's actions
record their ``dest`` as they run. No torch import.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from stoker.errors import UsageError

#: settings a resumed run never takes from the saved config: where it is, how to continue it, what
#: this terminal shows, a smoke run's budget, the weights of a new run, and the (redacted) credentials
NOT_CARRIED = ("out", "resume", "overwrite", "progress", "max_steps", "init_from", "storage_options")
#: config.json's resolved values and the requested ones they came from (a config.json without "requested")
_REQUESTED_KEYS = {"arch": "arch_requested", "amp": "amp_requested", "task": "task_requested"}
_GIVEN = "_given_flags"


def _noting(cls: type[argparse.Action]) -> type[argparse.Action]:
    class Noting(cls):  # type: ignore[misc, valid-type]
        def __call__(self, parser, namespace, values, option_string=None):
            super().__call__(parser, namespace, values, option_string)
            if option_string is not None:
                note_given(namespace, self.dest)

    Noting.__name__ = cls.__name__
    return Noting


def note_given(namespace: argparse.Namespace, dest: str) -> None:
    """Note that the option of ``dest`` was on the command line (what an action of its own calls)."""
    vars(namespace).setdefault(_GIVEN, set()).add(dest)


def note_given_flags(parser: argparse.ArgumentParser) -> None:
    """Make the options added to ``parser`` from now on note that they were given (:func:`given_flags`)."""
    for name in (None, "store", "store_const", "store_true", "store_false", "append"):
        parser.register("action", name, _noting(parser._registry_get("action", name)))


def given_flags(args: argparse.Namespace) -> set[str]:
    """The ``dest`` of each option on the command line that made ``args``."""
    return set(vars(args).get(_GIVEN, ()))


def saved_settings(config: dict[str, Any]) -> dict[str, Any]:
    """The settings a run was asked for, from its ``config.json`` (the resolved values' requests)."""
    if isinstance(config.get("requested"), dict):
        return dict(config["requested"])
    settings = dict(config)
    for key, requested in _REQUESTED_KEYS.items():
        if requested in settings:
            settings[key] = settings[requested]
    settings["device"] = "auto"
    if settings.get("classes"):  # the count was read from the manifest, not asked for
        settings["num_classes"] = None
    return settings


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _same(value: Any, saved: Any) -> bool:
    return json.loads(json.dumps(value, default=str)) == saved


def resume_settings(out: str | Path, fields: dict[str, Any], given: set[str]) -> tuple[dict[str, Any], str | None]:
    """``fields`` (a TrainConfig's, from this command line) with every setting not ``given`` taken
    from ``out/config.json``, and the line that says so (``None``: no saved config, ``fields``
    unchanged). A missing DATA with no saved run is a usage error."""
    path = Path(out) / "config.json"
    if not path.is_file():
        if fields.get("data") is None:
            raise UsageError(f"{out} holds no run to resume ({path.name} is missing): give DATA to start one")
        return fields, None
    try:
        saved = saved_settings(json.loads(path.read_text()))
    except (ValueError, OSError) as e:
        raise UsageError(f"{path}: not a run's config ({e}): give the flags again, or --overwrite") from None
    given = set(given) | ({"data"} if fields.get("data") is not None else set())
    merged, changed = dict(fields), []
    for key, value in saved.items():
        if key in NOT_CARRIED or key not in fields:
            continue
        if key not in given:
            merged[key] = value
        elif not _same(fields[key], value):
            name = "DATA" if key == "data" else _flag(key)
            shown = name if isinstance(value, bool) else f"{name} {fields[key]}"
            changed.append(f"{shown} (was {value})")
    line = f"the run's settings from {path}" + (
        f"; from the command line: {', '.join(changed)}" if changed else " (no flag changes them)"
    )
    return merged, line


__all__ = ["NOT_CARRIED", "given_flags", "note_given", "note_given_flags", "resume_settings", "saved_settings"]
