"""Work in worker processes, one way for all of stoker (pack, verify, index, bench, the pil backend).

* Workers start from a clean process: ``forkserver`` (``spawn`` where that is all there is),
  never a fork of this process. A fork copies every lock another thread holds at that moment
  (fsspec's IO loop, pyarrow's and torch's pools, DALI's), and the child can deadlock or crash
  on it; Python 3.14 makes ``forkserver`` the Linux default for this reason.
* A worker that dies (the kernel's OOM killer, a segfault in a codec, ``kill -9``) is noticed
  within seconds (:class:`concurrent.futures.ProcessPoolExecutor` watches its processes) and
  becomes one :class:`~stoker.errors.WorkerDiedError` line naming the item it was working on,
  its exit signal and the way to resume.
* Workers ignore Ctrl-C (the main process handles it) and die with their parent, even on
  ``kill -9`` (Linux ``PR_SET_PDEATHSIG``).
* At most ``window`` tasks are in flight, so memory stays flat however long the input.
"""

from __future__ import annotations

import collections
import contextlib
import io
import itertools
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from stoker.errors import UsageError, WorkerDiedError

_NO_TASK = -1
_table: Any = None  # in a worker: the shared (pid, task, item) table
_slot = -1  # in a worker: its row of the table


def start_method() -> str:
    """``forkserver`` where the platform has it, else ``spawn``; never ``fork``."""
    return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


#: imported once by the fork server instead of by every worker, when this process has them already
_PRELOAD = ("numpy", "PIL.Image", "torch", "stoker.pipeline.backends.pil", "stoker.tools.pack.sanitize")


def context(main: bool = False) -> multiprocessing.context.BaseContext:
    """The multiprocessing context every stoker worker starts from (:func:`start_method`).

    The fork server (one per process, shared with any other user of ``forkserver``) preloads the
    heavy modules this process already imported, so a worker starts in ~0.1 s, not the ~1.5 s
    of importing torch. Its workers do not import the main script unless ``main`` (the work
    refers to something defined there, :func:`refers_to_main`): a script that runs stoker, or
    ``torch.distributed``, at its top level is not run again in each worker (spawn's rule, which
    would make such a script start workers from its workers, or join its process group twice)."""
    ctx = multiprocessing.get_context(start_method())
    if ctx.get_start_method() != "forkserver":
        return ctx
    ctx.set_forkserver_preload([__name__, *(m for m in _PRELOAD if m in sys.modules)])  # read at the server's start
    return ctx if main else _without_main()


def refers_to_main(*objs: Any) -> bool:
    """Whether ``objs`` name the main script (a class or function defined in it, or an object
    whose pickle names one), so a worker must import it to unpickle them. An object that does
    not pickle: True (the default behaviour)."""
    import pickle

    for o in objs:
        if isinstance(o, type) or callable(o) and hasattr(o, "__qualname__"):  # pickled by name
            if getattr(o, "__module__", None) == "__main__":
                return True
            continue
        try:
            if b"__main__" in pickle.dumps(o):
                return True
        except Exception:  # boundary: any pickling failure means "do as multiprocessing does"
            return True
    return False


def _without_main() -> multiprocessing.context.BaseContext:
    """A fork-server context whose processes skip importing the main script."""
    global _no_main_ctx
    if _no_main_ctx is None:
        _no_main_ctx = _NoMainContext()
    return _no_main_ctx


_no_main_ctx = None

if sys.platform != "win32":  # the fork server's classes; pickled to the workers by name, so at module level
    from multiprocessing import context as _mpc
    from multiprocessing import forkserver as _forkserver
    from multiprocessing import popen_forkserver as _popen_forkserver
    from multiprocessing import reduction as _reduction
    from multiprocessing import spawn as _spawn
    from multiprocessing import util as _util

    class _NoMainPopen(_popen_forkserver.Popen):
        """``Popen._launch`` of the standard library, with the preparation data minus its
        ``init_main_from_*`` keys."""

        def _launch(self, process_obj):
            prep_data = _spawn.get_preparation_data(process_obj._name)
            prep_data.pop("init_main_from_name", None)
            prep_data.pop("init_main_from_path", None)
            buf = io.BytesIO()
            _mpc.set_spawning_popen(self)
            try:
                _reduction.dump(prep_data, buf)
                _reduction.dump(process_obj, buf)
            finally:
                _mpc.set_spawning_popen(None)
            self.sentinel, w = _forkserver.connect_to_new_process(self._fds)
            parent_w = os.dup(w)  # the child's sentinel of its parent, kept as the standard library does
            self.finalizer = _util.Finalize(self, _util.close_fds, (parent_w, self.sentinel))
            with open(w, "wb", closefd=True) as f:
                f.write(buf.getbuffer())
            self.pid = _forkserver.read_signed(self.sentinel)

    class _NoMainProcess(_mpc.ForkServerProcess):
        @staticmethod
        def _Popen(process_obj):
            return _NoMainPopen(process_obj)

    class _NoMainContext(_mpc.ForkServerContext):
        Process = _NoMainProcess


#: the longest path of a unix socket (Linux: 108 bytes with the NUL)
SOCKET_PATH_MAX = 107
#: what multiprocessing adds to its temp folder for the fork server's socket ("/pymp-XXXXXXXX/listener-XXXXXXXX")
_SOCKET_SUFFIX = 34


def _short_socket_folder() -> None:
    """multiprocessing puts the fork server's socket in a folder it makes under ``TMPDIR``; under a
    long one (a cluster job's scratch folder, a test's ``tmp_path``) that path is longer than a
    socket's may be, and every worker's start fails with "AF_UNIX path too long". Such a folder is
    replaced, for this process, by one under ``/tmp`` (removed at exit, as multiprocessing's is)."""
    import shutil
    import tempfile
    from multiprocessing import process, util

    config = process.current_process()._config
    where = config.get("tempdir") or tempfile.gettempdir()
    if len(where) + _SOCKET_SUFFIX <= SOCKET_PATH_MAX:
        return
    try:
        short = tempfile.mkdtemp(prefix="pymp-", dir="/tmp")
    except OSError:  # no /tmp to write: multiprocessing's own error names the path
        return
    util.Finalize(None, shutil.rmtree, args=[short], exitpriority=-100)
    config["tempdir"] = short


def _start_fork_server_deaf_to_ctrl_c(ctx: multiprocessing.context.BaseContext) -> None:
    """Start the fork server (when ``ctx`` uses one and it is not running) with Ctrl-C ignored, a
    disposition it keeps across its ``exec`` (a blocked mask is not kept): a terminal's Ctrl-C
    reaches the whole process group, and the server, still importing its preloads, would print a
    KeyboardInterrupt traceback and die, failing the next worker's start with an EOFError. The
    server ignores Ctrl-C from then on anyway; only the milliseconds of its ``fork`` and ``exec``
    are deaf in this process."""
    if ctx.get_start_method() != "forkserver" or threading.current_thread() is not threading.main_thread():
        return
    _short_socket_folder()
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        _forkserver.ensure_running()
    finally:
        signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def _ctrl_c_deferred() -> Iterator[None]:
    """Hold a Ctrl-C until the block ends, then handle it as this process would have: the workers
    a pool starts are all known (and killed on the way out) instead of one half-started, which
    would print a traceback of its own once this process is gone."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught and callable(previous):
        previous(signal.SIGINT, None)


def check_not_bootstrapping() -> None:
    """Refuse to start workers from a worker's own start-up: a worker imports the main script
    (the spawn and fork-server rule), so a script that calls stoker at its top level would
    start workers from each of them. Raises :class:`~stoker.errors.UsageError` saying the fix."""
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        raise UsageError(
            "stoker's worker processes import your main script, and its top level starts stoker's workers "
            'again: put the code that calls stoker under `if __name__ == "__main__":`'
        )


def die_with_parent() -> None:
    """In a worker: leave Ctrl-C to the main process, and exit as soon as the process that started
    it is gone, even after ``kill -9``. A fork server's worker is the server's child, and the server
    outlives a killed parent while any worker runs, so ``PR_SET_PDEATHSIG`` alone would keep both
    (and the pipes they hold) forever: a thread waits on the parent's sentinel instead."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = multiprocessing.parent_process()
    if parent is not None:
        threading.Thread(target=_exit_with, args=(parent,), name="stoker-parent-watch", daemon=True).start()
    elif sys.platform.startswith("linux"):  # a process not started by multiprocessing
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None).prctl(pr_set_pdeathsig, signal.SIGKILL)


def _exit_with(parent) -> None:
    parent.join()  # returns when the parent's end of the sentinel pipe closes: it exited or was killed
    os._exit(1)


def as_parent(env: dict[str, str], cwd: str) -> None:
    """In a worker: the parent's environment and working folder as they are now. A fork server
    forks workers from itself, with what the parent had when the server started (credentials
    set later, a chdir since, would be missing)."""
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)


def _init(table, counter, env: dict[str, str], cwd: str) -> None:
    global _table, _slot
    die_with_parent()
    as_parent(env, cwd)
    with counter.get_lock():
        _slot = counter.value
        counter.value += 1
    _table = table


def _mark(task: int, item: int) -> None:
    row = 3 * _slot
    _table[row : row + 3] = [os.getpid(), task, item]


def _run(task: int, fn: Callable, items: list) -> list:
    """One task in a worker: ``fn`` on each item, each marked in the table before it starts."""
    out = []
    for j, item in enumerate(items):
        _mark(task, j)
        out.append(fn(item))
    _mark(_NO_TASK, 0)
    return out


def signal_name(exitcode: int | None) -> str:
    """``SIGKILL`` for -9, ``exit status 3`` for 3."""
    if exitcode is None:
        return "no exit status"
    if exitcode < 0:
        try:
            return signal.Signals(-exitcode).name
        except ValueError:
            return f"signal {-exitcode}"
    return f"exit status {exitcode}"


#: how often a wait on the workers wakes to let a Ctrl-C through (see :func:`_first_done`)
_WAKE_S = 0.25


def _first_done(futures: list) -> set:
    """The done ones of ``futures``, once one is. Waits in slices: the kernel hands a Ctrl-C to any
    thread of the process (the pool's manager thread, a queue feeder), and then Python raises
    KeyboardInterrupt only when the main thread next runs, which a wait without a timeout never
    does while a worker hangs on an input (a pack stuck on Ctrl-C until killed)."""
    from concurrent.futures import FIRST_COMPLETED, wait

    while True:
        done, _ = wait(futures, timeout=_WAKE_S, return_when=FIRST_COMPLETED)
        if done:
            return done


class Workers:
    """A pool of ``workers`` processes mapping a function over items, chunked, with a bounded window.

    Args:
        workers: how many processes.
        doing: what a worker does to an item, for the error line (``"sanitizing"``).
        resume: what the user does after a worker died (``"rerun the same command to resume"``).
        chunk: items per task (amortizes inter-process overhead).
        window: tasks in flight per worker.
    """

    def __init__(self, workers: int, *, doing: str, resume: str, chunk: int = 1, window: int = 4):
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        check_not_bootstrapping()
        self.workers, self.doing, self.resume, self.chunk, self.window = workers, doing, resume, chunk, window
        self._pool: ProcessPoolExecutor | None = None  # started by the first map(), which knows the work
        self._procs: dict[int, Any] = {}

    def _start(self, fn: Callable, first: list) -> ProcessPoolExecutor:
        ctx = context(main=refers_to_main(fn, first))
        _start_fork_server_deaf_to_ctrl_c(ctx)
        self._table = ctx.Array("q", 3 * self.workers, lock=False)
        self._table[:] = [0, _NO_TASK, 0] * self.workers
        init = (self._table, ctx.Value("i", 0), dict(os.environ), os.getcwd())
        return ProcessPoolExecutor(self.workers, ctx, initializer=_init, initargs=init)

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc) -> None:
        self.close(kill=exc[0] is not None)

    def close(self, kill: bool = False) -> None:
        """Stop the workers: at once when ``kill`` (an error or Ctrl-C), else once idle."""
        if self._pool is None:
            return
        if kill:
            self._procs.update(getattr(self._pool, "_processes", None) or {})
            for p in self._procs.values():
                if p.exitcode is None:
                    p.kill()
        self._pool.shutdown(wait=True, cancel_futures=True)

    def map(
        self, fn: Callable, items: Iterable, *, ordered: bool = True, name: Callable[[Any], str] = str
    ) -> Iterator[Any]:
        """``fn(item)`` for each item, in their order (``ordered``) or as they finish (then each
        result comes as ``(position, result)``). ``fn`` must be picklable (a module-level function
        or a ``functools.partial`` of one). ``name(item)`` names the item in the error line."""
        chunks = _chunks(iter(items), self.chunk)
        first = next(chunks, None)
        if first is None:
            return
        if self._pool is None:
            self._pool = self._start(fn, first)
        chunks = itertools.chain([first], chunks)
        pending: collections.deque = collections.deque()
        held: dict[int, list] = {}  # task -> its items, while in flight
        starts: dict[int, int] = {}  # task -> position of its first item
        position, task = 0, 0

        def submit() -> bool:
            nonlocal position, task
            c = next(chunks, None)
            if c is None:
                return False
            held[task], starts[task] = c, position
            pending.append((task, self._pool.submit(_run, task, fn, c)))
            self._procs.update(self._pool._processes or {})  # for the exit status, if one dies
            position, task = position + len(c), task + 1
            return True

        with _ctrl_c_deferred():  # the first submission starts the workers
            while len(pending) < self.window * self.workers and submit():
                pass
        try:
            while pending:
                if ordered:
                    t, fut = pending.popleft()
                else:
                    done = _first_done([f for _, f in pending])
                    t, fut = next((t, f) for t, f in pending if f in done)
                    pending.remove((t, fut))
                _first_done([fut])
                results = fut.result()
                first = starts.pop(t)
                del held[t]
                submit()
                if ordered:
                    yield from results
                else:
                    yield from enumerate(results, start=first)
        except BrokenProcessPool:
            raise WorkerDiedError(self._death_line(held, name)) from None

    def _death_line(self, held: dict[int, list], name: Callable[[Any], str]) -> str:
        """Which worker died, on what, with which signal, and what to do."""
        for p in self._procs.values():
            p.join(timeout=5)
        dead = [p for p in self._procs.values() if p.exitcode not in (None, 0)]
        # the pool terminates (SIGTERM) the others once one has died, and a status its fork server could
        # not report reads 255: the cause is the one with another status
        dead.sort(key=lambda p: (p.exitcode == -signal.SIGTERM, p.exitcode == 255))
        rows = {self._table[3 * k]: (self._table[3 * k + 1], self._table[3 * k + 2]) for k in range(self.workers)}
        what = ""
        if dead:
            task, item = rows.get(dead[0].pid, (_NO_TASK, 0))
            if task in held and item < len(held[task]):
                what = f" while {self.doing} {name(held[task][item])}"
        how = signal_name(dead[0].exitcode) if dead else "no exit status"
        hint = {
            "SIGKILL": ", as the kernel's out-of-memory killer sends",
            "exit status 1": ": its error is above",
        }.get(how, "")
        return f"a worker process died ({how}{hint}){what}; {self.resume}"


def _chunks(items: Iterator, size: int) -> Iterator[list]:
    while True:
        c = list(itertools.islice(items, size))
        if not c:
            return
        yield c


__all__ = [
    "Workers",
    "as_parent",
    "check_not_bootstrapping",
    "context",
    "die_with_parent",
    "refers_to_main",
    "signal_name",
    "start_method",
]
