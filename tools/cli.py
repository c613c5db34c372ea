"""The ``stoker`` command. Each subcommand lives in its own module exposing
``HELP`` (one line), ``add_arguments(parser)`` and ``main(args) -> int``; modules
keep heavy imports (torch, DALI) inside functions so ``stoker --help`` is instant."""

from __future__ import annotations

import argparse
import errno
import importlib
import sys
from collections.abc import Sequence

from stoker import __version__
from stoker.errors import StokerError

# name -> module (relative to stoker.tools); the order is the order in --help.
COMMANDS = {
    "pack": "pack.command",
    "verify": "verify.command",
    "index": "verify.indexing",
    "bench-pack": "bench.packing",
    "bench": "bench.loader",
    "train": "train",
    "bench-model": "bench.model",
    "diagnose": "diagnose.command",
    "demo": "demo",
    "gpu-check": "gpu_check.command",
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


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stoker", description="Keep the GPU fed: pack, load, train, measure.")
    parser.add_argument("-V", "--version", action="version", version=f"stoker {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, modname in COMMANDS.items():
        mod = importlib.import_module(f"stoker.tools.{modname}")
        p = sub.add_parser(
            name,
            help=mod.HELP,
            description=(mod.__doc__ or mod.HELP).strip(),
            formatter_class=HelpFormatter,
        )
        mod.add_arguments(p)
        p.set_defaults(_main=mod.main)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = get_args_parser()
    args = parser.parse_args(argv)
    if args.command is None:  # bare `stoker`: what it can do, and exit 0 (not argparse's usage error)
        parser.print_help()
        return 0
    try:
        return int(args._main(args) or 0)
    except StokerError as e:
        label = "error: " if e.exit_code == 2 else ""
        print(f"stoker {args.command}: {label}{e}", file=sys.stderr)
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
