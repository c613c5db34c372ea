"""The ``stoker`` command. Each subcommand lives in its own module exposing
``HELP`` (one line), ``add_arguments(parser)`` and ``main(args) -> int``; modules
keep heavy imports (torch, DALI) inside functions so ``stoker --help`` is instant."""

from __future__ import annotations

import argparse
import errno
import functools
import importlib
import sys
from collections.abc import Callable, Sequence
from types import ModuleType

from stoker import __version__
from stoker.errors import StokerError, UsageError

# name -> module; the order is the order in --help.
COMMANDS = {
    "pack": "stoker.tools.pack.command",
    "verify": "stoker.tools.verify.command",
    "index": "stoker.tools.verify.indexing",
    "bench-pack": "stoker.tools.bench.packing",
    "bench": "stoker.tools.bench.loader",
    "train": "stoker.tools.train",
    "eval": "stoker.tools.eval",
    "bench-model": "stoker.benchmarks.model",
    "diagnose": "stoker.tools.diagnose.command",
    "demo": "stoker.tools.demo",
    "gpu-check": "stoker.benchmarks.gpu_check.command",
}

# Commands whose module is in the repository's benchmarks/, which the wheel leaves out: from an
# installed wheel they stay listed, with this help, and say in one line where they run.
CHECKOUT_ONLY = {
    "bench-model": "model-only training speed (from a checkout of stoker's repository)",
    "gpu-check": "measure stoker on a GPU (from a checkout of stoker's repository)",
}


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The commands' help: the description as written, and every option's default shown (unless
    its help already says it, or it has none worth saying)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        quiet = action.default in (None, False, argparse.SUPPRESS) or isinstance(action, argparse._VersionAction)
        if "default" in text or quiet or action.option_strings == [] and action.nargs in ("?", "*"):
            return text
        return f"{text} (default: %(default)s)" if text else "(default: %(default)s)"


def _command_module(name: str, modname: str) -> ModuleType | None:
    """The command's module, or None for a benchmark that this installation (a wheel) lacks."""
    try:
        return importlib.import_module(modname)
    except ModuleNotFoundError as e:
        if name in CHECKOUT_ONLY and (e.name or "").startswith("stoker.benchmarks") and modname.startswith(e.name):
            return None
        raise


def _checkout_only(name: str, modname: str, args: argparse.Namespace) -> int:
    runner = modname.removesuffix(".command")
    raise UsageError(
        f"{name} is a benchmark that runs from a checkout of stoker's repository (the wheel leaves "
        f"benchmarks/ out): there, `python -m {runner}` or `stoker {name}` after `pip install -e .`"
    )


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stoker", description="Keep the GPU fed: pack, load, train, measure.")
    parser.add_argument("-V", "--version", action="version", version=f"stoker {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, modname in COMMANDS.items():
        mod = _command_module(name, modname)
        if mod is None:
            p = sub.add_parser(name, help=CHECKOUT_ONLY[name], description=CHECKOUT_ONLY[name])
            p.set_defaults(_main=functools.partial(_checkout_only, name, modname), _any_flags=True)
            continue
        p = sub.add_parser(
            name,
            help=mod.HELP,
            description=(mod.__doc__ or mod.HELP).strip(),
            formatter_class=HelpFormatter,
        )
        mod.add_arguments(p)
        p.set_defaults(_main=mod.main)
    return parser


def flag_spelling(parser: argparse.ArgumentParser, command: str) -> Callable[[str], str]:
    """How ``stoker COMMAND`` names a Python argument in an error (:func:`stoker.errors.arg`):
    the first long option of the action whose ``dest`` it is (``workers`` -> ``--workers``), a
    positional's metavar (``src`` -> ``SRC``); a plural keyword is its repeated flag's dest
    (``storage_options`` -> ``--storage-option``); any other name is spelled as stoker's flags are
    (``num_classes`` -> ``--num-classes``: a hint about another command's flag)."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    flags: dict[str, str] = {}
    for action in sub.choices[command]._actions:
        names = [o for o in action.option_strings if o.startswith("--")] or action.option_strings
        flags.setdefault(action.dest, names[0] if names else action.metavar or action.dest.upper())
    return lambda name: flags.get(name) or flags.get(name.removesuffix("s")) or "--" + name.replace("_", "-")


def main(argv: Sequence[str] | None = None) -> int:
    parser = get_args_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown and not getattr(args, "_any_flags", False):  # what parse_args says (a stub takes any)
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.command is None:  # bare `stoker`: what it can do, and exit 0 (not argparse's usage error)
        parser.print_help()
        return 0
    try:
        return int(args._main(args) or 0)
    except StokerError as e:
        label = "error: " if e.exit_code == 2 else ""
        print(f"stoker {args.command}: {label}{e.spelled(flag_spelling(parser, args.command))}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print(f"stoker {args.command}: interrupted", file=sys.stderr)
        return 130
    except OSError as e:  # a full disk mid-write, in any command: one line, the journals resume
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        where = f" writing {e.filename}" if e.filename else ""
        print(
            f"stoker {args.command}: disk full{where}: free space and rerun the same command "
            "(what was finished is kept, nothing written is corrupt)",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
