"""The ``stoker`` command. Each subcommand lives in its own module exposing
``HELP`` (one line), ``add_arguments(parser)`` and ``main(args) -> int`` (and, when a rerun
resumes it, ``ON_INTERRUPT``: what Ctrl-C's one line adds); modules keep heavy imports (torch,
DALI) inside functions so ``stoker --help`` is instant."""

from __future__ import annotations

import argparse
import errno
import functools
import importlib
import sys
from collections.abc import Callable, Sequence
from types import ModuleType

from stoker.errors import StokerError, UsageError, close_names, unknown_choice
from stoker.version import __version__

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


EXAMPLES = """examples:
  stoker pack photos/ packed/ --val-fraction 0.1     # an ImageFolder -> packed/train + packed/val
  stoker verify packed/train                         # every shard checked against its manifest
  stoker bench packed/train                          # the Loader's images/s on this machine
  stoker train packed/ --out runs/a --epochs 10      # AMP, DDP under torchrun, exact resume
  stoker eval runs/a packed/val                      # the run's best.pt on val, per class
  stoker diagnose packed/train --arch resnet50       # why is my training slow?

`stoker COMMAND --help` lists a command's options."""


#: flags that timm's, pytorch/examples' and the DataLoader's users type, and the stoker flag each
#: means, with why where the meaning differs: said instead of a guess when the command has that flag
#: (the names whose meaning is the same are aliases: -b, -j, --workers, --smoothing)
FAMILIAR: dict[str, tuple[str, str]] = {
    "--bs": ("--batch-size", ""),
    "--lr-rate": ("--lr", ""),
    "--learning-rate": ("--lr", "the peak rate: a linear warm-up, then cosine decay to 0"),
    "--num-workers": ("--threads", "the Loader's decode threads or processes; -j/--workers name it too"),
    "--wd": ("--weight-decay", ""),
    "--opt": ("--optimizer", "sgd or adamw"),
    "--sched": ("--warmup-epochs", "the schedule is one: a linear warm-up, then cosine decay to 0"),
    "--img-size": ("--crop", "the side of the crop the Loader yields"),
    "--input-size": ("--crop", "the side of the crop the Loader yields, or H,W"),
    "--image-size": ("--crop", "the side of the crop the Loader yields"),
    "--pretrained": ("--init-from", "nothing is downloaded: give a checkpoint or a state_dict file"),
    "--gpu": ("--device", "cuda:N; several GPUs: torchrun --nproc_per_node N -m stoker train"),
    "--print-freq": ("--log-every", "steps between log lines"),
    "--log-interval": ("--log-every", "steps between log lines"),
}


def flag_suggestion(flag: str, options: Sequence[str]) -> str:
    """What an unknown ``flag`` most likely meant among ``options``, as ``did you mean --lr?`` (with
    why where another tool's flag of that name means something else: :data:`FAMILIAR`), or ``""``."""
    mine, why = FAMILIAR.get(flag, ("", ""))
    if mine in options:
        return f"did you mean {mine}?" + (f" ({why})" if why else "")
    close = close_names(flag, [o for o in options if o.startswith("--")])
    return f"did you mean {' or '.join(close)}?" if close else ""


def _options(parser: argparse.ArgumentParser) -> list[str]:
    return [o for a in parser._actions for o in a.option_strings]


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The commands' help: the description as written, and every option's default shown (unless
    its help already says it, or it has none worth saying: a flag that takes no value, such as
    ``--no-progress``, says what it does, not ``(default: True)``)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        quiet = (
            action.default in (None, False, argparse.SUPPRESS)
            or action.nargs == 0  # store_true/store_false/store_const: a switch, not a value
            or isinstance(action, argparse._VersionAction)
        )
        if "default" in text or quiet or action.option_strings == [] and action.nargs in ("?", "*"):
            return text
        return f"{text} (default: %(default)s)" if text else "(default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """stoker's parsers: a flag is spelt whole (``--epoch`` is refused, never taken as ``--epochs``),
    and a command or choice that is none of its choices names the close ones
    (:func:`~stoker.errors.unknown_choice`); :func:`unrecognized` does the same for unknown flags."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_args(self, args=None, namespace=None):
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            self.error(unrecognized(self, extras))
        return parsed

    def note_typos(self, argv: Sequence[str]) -> None:
        """Remember what the first unknown ``--flag`` of ``argv`` most likely meant, so an error
        argparse raises before it lists unknown flags (a required flag missing: ``--ouput RUN``
        for ``--out RUN``) names it too."""
        known = _options(self)
        flags = [x.split("=", 1)[0] for x in argv if x.startswith("--") and len(x) > 2]
        typo = next((f for f in flags if f not in known), None)
        meant = flag_suggestion(typo, known) if typo else ""
        self._typo = f"{typo} is not a flag: {meant}" if meant else ""

    def error(self, message: str):
        """One line, the way every other stoker error is (argparse prints the whole usage first,
        35 lines for ``stoker train``), and where the options are listed."""
        typo = getattr(self, "_typo", "")
        if typo and not message.startswith("unrecognized arguments"):
            message += f" ({typo})"
        self.exit(2, f"{self.prog}: error: {message}; see {self.prog} --help\n")

    def _check_value(self, action: argparse.Action, value) -> None:
        if action.choices is None or value in action.choices:
            return
        what = "command" if isinstance(action, argparse._SubParsersAction) else "value"
        raise argparse.ArgumentError(action, unknown_choice(what, str(value), [str(c) for c in action.choices]))


def unrecognized(parser: argparse.ArgumentParser, extras: Sequence[str]) -> str:
    """argparse's ``unrecognized arguments`` line, with the flags of ``parser`` the first unknown
    flag most likely meant (``--batchsize`` -> ``--batch-size``)."""
    text = f"unrecognized arguments: {' '.join(extras)}"
    flag = next((x.split("=", 1)[0] for x in extras if x.startswith("-") and len(x) > 1), None)
    meant = flag_suggestion(flag, _options(parser)) if flag else ""
    return text + (f": {meant}" if meant else "")


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
    parser = Parser(
        prog="stoker",
        description="Keep the GPU fed: pack, load, train, measure.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
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
        p.set_defaults(_main=mod.main, _on_interrupt=getattr(mod, "ON_INTERRUPT", ""))
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


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The parser of each ``stoker COMMAND``, by name."""
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


def _subparser(parser: argparse.ArgumentParser, command: str | None) -> argparse.ArgumentParser:
    """The parser of ``stoker COMMAND`` (``parser`` itself when there is none)."""
    return parser if command is None else _commands(parser)[command]


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        parser = get_args_parser()
        command = next((a for a in argv if not a.startswith("-")), None)
        if command in _commands(parser):
            _commands(parser)[command].note_typos(argv)
        args, unknown = parser.parse_known_args(argv)
    except KeyboardInterrupt:  # before any work: nothing to resume
        print("stoker: interrupted", file=sys.stderr)
        return 130
    if unknown and not getattr(args, "_any_flags", False):  # what parse_args says (a stub takes any)
        command = getattr(args, "command", None)
        _subparser(parser, command).error(unrecognized(_subparser(parser, command), unknown))
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
        hint = getattr(args, "_on_interrupt", "")
        print(f"stoker {args.command}: interrupted" + (f"; {hint}" if hint else ""), file=sys.stderr)
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
