"""Running a page's code blocks: the running half of the docs tests (``docs_pages.py`` parses).

A page runs in its own temporary folder, its blocks in page order: python blocks in one
namespace per page (so a later block uses the names of an earlier one, as a reader would), shell
blocks with bash (``set -euo pipefail``, traced with ``set -x``) in the same folder, with
``stoker`` on the PATH being this checkout's command and ``python`` this interpreter. HOME is the
folder's ``home/`` (so ``~/data/...`` is generated data), and before a block runs:

1. the page's ``replace`` markers apply (the scale-downs the page declares, with their reason);
2. :data:`ABSOLUTE_ROOTS`: an absolute path under one of these folders (``/fast/inet``,
   ``/data/imagenet``, ``/tmp/x``) is read under the page's folder instead;
3. without a CUDA device, :data:`PY_CUDA` / :data:`SH_CUDA` read the CUDA device as the CPU
   (``device="cuda"``, ``.cuda()``, ``torch.autocast("cuda", ...)``, ``--device cuda``).

A page's registrations (a pack source, a target kind or a decode backend of its own, registered
in a python block) are undone when the page is done: the next page sees the package's own.

A failure names the page and line, the block as it ran and the tail of its output.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import io
import os
import re
import signal
import subprocess
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from docs_pages import PYTHON, Block, Page, console_script

#: the first folders of the absolute paths pages name; such a path is read under the page's folder
ABSOLUTE_ROOTS = ("fast", "data", "tmp", "nvme", "shared", "nfs", "path")
_ABSOLUTE = re.compile(rf"(?<![\w.~/$:-])/(?=(?:{'|'.join(ABSOLUTE_ROOTS)})(?:/|\b))")
#: without CUDA: the rewrites that run a python block's CUDA device on the CPU
PY_CUDA = (
    (re.compile(r"""(["'])cuda(?::\d+)?\1"""), r"\1cpu\1"),
    (re.compile(r"\.cuda\(\)"), '.to("cpu")'),
    (re.compile(r"\.cuda\("), '.to("cpu", '),
)
#: without CUDA: the same for a shell block's ``--device cuda``
SH_CUDA = ((re.compile(r"--device(\s+|=)cuda(?::\d+)?\b"), r"--device\1cpu"),)
#: the modules of the registries (``_REGISTRY``: a Registry) a page may add to, restored after it
REGISTRIES = (
    "stoker.tools.pack.sources.registry",
    "stoker.pipeline.shards.kinds.base",
    "stoker.pipeline.backends.registry",
)
#: seconds a shell block may take before it is killed and fails (the slowest took 46 s with the
#: suite in two processes on two cores)
TIMEOUT = 120
#: lines of output a failure shows
TAIL = 40


class BlockFailed(Exception):
    """A block failed; the message says where, what ran and how it ended."""


class EarlierFailed(Exception):
    """A block was not run: one before it on its page failed (that one's test says why)."""


@dataclass
class Workdir:
    """What a page's setups prepare and its blocks run in."""

    root: Path  #: the blocks' working folder; the pages' absolute paths land under it
    home: Path  #: HOME for the blocks (``~``)
    names: dict = field(default_factory=dict)  #: the python blocks' namespace
    cleanups: list[Callable[[], None]] = field(default_factory=list)  #: run when the page is done


class PageRun:
    """One page's folder, namespace and blocks, run in page order (each once)."""

    def __init__(self, page: Page, root: Path, *, setups: dict, shell_env: Callable[[Workdir], dict], cuda: bool):
        self.page, self.cuda, self._shell_env = page, cuda, shell_env
        self.work = Workdir(root=root, home=root / "home")
        self.work.home.mkdir(parents=True, exist_ok=True)
        self.work.names.update({"__name__": "__docs__", "__builtins__": __builtins__})
        self.done: dict[int, str | None] = {}  # block line -> None (passed) or the failure
        self._setups, self._set_up, self._setup_failed = setups, False, ""
        for name in REGISTRIES:
            self.work.cleanups.append(_restorer(importlib.import_module(name)))

    def run(self, block: Block) -> None:
        """Run ``block``, after the page's earlier blocks (run now if not yet run)."""
        if not self._set_up:
            self._set_up = True
            try:
                for name in self.page.setups:
                    self._setup(name)
            except BlockFailed as e:
                self._setup_failed = str(e)
        if self._setup_failed:
            raise BlockFailed(self._setup_failed)
        for earlier in self.page.blocks:
            if earlier is block:
                break
            if earlier.runs and not earlier.skip and earlier.line not in self.done:
                self._run_once(earlier)
            if self.done.get(earlier.line):
                raise EarlierFailed(f"not run: {earlier.id}, before it on the page, failed")
        self._run_once(block)
        if self.done[block.line]:
            raise BlockFailed(self.done[block.line])

    def close(self) -> None:
        for cleanup in reversed(self.work.cleanups):
            cleanup()
        self.work.names.clear()
        gc.collect()  # a page's Loaders release their pipelines now

    # ---- one block -------------------------------------------------------------------------
    def _run_once(self, block: Block) -> None:
        code = self.rewrite(block)
        try:
            for name in block.before:
                self._setup(name)
            if block.lang in PYTHON:
                self._python(block, code)
            else:
                self._shell(block, console_script(code) if block.lang == "console" else code)
            self.done[block.line] = None
        except BlockFailed as e:
            self.done[block.line] = str(e)

    def _setup(self, name: str) -> None:
        try:
            with self._inside():
                self._setups[name](self.work)
        except Exception:
            raise BlockFailed(f"{self.page.path}: setup {name!r} failed\n{traceback.format_exc()}") from None

    def rewrite(self, block: Block) -> str:
        """The block as it runs: the page's replacements, the absolute paths, the device."""
        code = block.text
        for old, new in block.replace:
            code = code.replace(old, new)
        code = _ABSOLUTE.sub(str(self.work.root).replace("\\", "\\\\") + "/", code)
        if not self.cuda:
            for pattern, new in PY_CUDA if block.lang in PYTHON else SH_CUDA:
                code = pattern.sub(new, code)
        return code

    def _python(self, block: Block, code: str) -> None:
        # padded to the block's lines, compiled as the page: a traceback names the page's line
        compiled = compile("\n" * block.line + code, str(Path(self.page.path).resolve()), "exec")
        out = io.StringIO()
        try:
            with self._inside(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                exec(compiled, self.work.names)
        except (Exception, SystemExit):  # a snippet's sys.exit() is its failure, not the session's
            raise BlockFailed(
                self._message(block, code, "raised", out.getvalue() + traceback.format_exc(limit=-8))
            ) from None

    def _shell(self, block: Block, code: str) -> None:
        script = "set -euo pipefail\nPS4='+ '\nset -x\n" + code
        proc = subprocess.Popen(
            ["bash", "-c", script],
            cwd=self.work.root,
            env=self._shell_env(self.work),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            start_new_session=True,
        )
        try:
            out, _ = proc.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            raise BlockFailed(
                self._message(block, code, f"took more than {TIMEOUT} s (scale it down with a replace marker)", out)
            ) from None
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        if proc.returncode:
            raise BlockFailed(self._message(block, code, f"exit status {proc.returncode}", out))

    @contextlib.contextmanager
    def _inside(self):
        """The page's folder as the working directory and its home as HOME, for in-process code."""
        cwd, home = os.getcwd(), os.environ.get("HOME")
        os.chdir(self.work.root)
        os.environ["HOME"] = str(self.work.home)
        try:
            yield
        finally:
            os.chdir(cwd)
            if home is None:
                os.environ.pop("HOME", None)
            else:
                os.environ["HOME"] = home

    def _message(self, block: Block, code: str, how: str, output: str) -> str:
        lines = [f"{block.id}: the {block.lang} block failed: {how}", "", "the block as the page has it:"]
        lines += ["    " + line for line in block.text.rstrip().splitlines()]
        if code != block.text:
            lines += ["", "as it ran (its replace markers; absolute paths under the page's folder; CUDA as the CPU):"]
            lines += ["    " + line for line in code.rstrip().splitlines()]
        tail = output.rstrip().splitlines()[-TAIL:]
        lines += ["", f"output (last {len(tail)} lines):"] + ["    " + line for line in tail]
        lines += ["", f"working folder: {self.work.root}"]
        return "\n".join(lines)


def _restorer(module) -> Callable[[], None]:
    """What puts ``module``'s registry back as it is now (a reader a page registered is gone)."""
    saved = module._REGISTRY.copy()

    def restore() -> None:
        module._REGISTRY.restore(saved)

    return restore
