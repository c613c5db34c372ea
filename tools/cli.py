"""The ``stoker`` command. Each subcommand lives in its own module exposing
``HELP`` (one line), ``add_arguments(parser)`` and ``main(args) -> int``; modules
keep heavy imports (torch, DALI) inside functions so ``stoker --help`` is instant."""

from __future__ import annotations

import argparse
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


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stoker", description="Keep the GPU fed: pack, load, train, measure.")
    parser.add_argument("--version", action="version", version=f"stoker {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, modname in COMMANDS.items():
        mod = importlib.import_module(f"stoker.tools.{modname}")
        p = sub.add_parser(
            name,
            help=mod.HELP,
            description=(mod.__doc__ or mod.HELP).strip(),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        mod.add_arguments(p)
        p.set_defaults(_main=mod.main)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = get_args_parser()
    args = parser.parse_args(argv)
    try:
        return int(args._main(args) or 0)
    except StokerError as e:
        label = "error: " if e.exit_code == 2 else ""
        print(f"stoker {args.command}: {label}{e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print(f"stoker {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
