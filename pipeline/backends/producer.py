"""The producer thread the DALI and nvjpeg backends share: it prepares batches ahead while
the caller trains, hands failures to the consumer, and is stopped in order at exit; and
:func:`ahead`, a stage of a producer run in a thread of its own (the nvjpeg backend reads and
decodes batch k+1 there while its producer thread resizes batch k)."""

from __future__ import annotations

import atexit
import contextlib
import queue
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any


class Failure:
    """An exception raised in the producer, handed to the consumer to raise there."""

    def __init__(self, error: BaseException):
        self.error = error


#: what the producer puts last when the epoch's batches are all out
END = object()


def put(out_q: queue.Queue, stop: threading.Event, item: Any) -> None:
    """``out_q.put(item)`` that never blocks past a consumer that has gone (``stop`` set)."""
    while not stop.is_set():
        try:
            out_q.put(item, timeout=0.1)
            return
        except queue.Full:
            pass


class StageFailure(Exception):
    """An exception raised by an :func:`ahead` stage on ``item``: raised in the thread reading it."""

    def __init__(self, item: Any, error: BaseException):
        super().__init__(str(error))
        self.item, self.error = item, error


def ahead(
    func: Callable[[Any], Any],
    items: Iterable,
    stop: threading.Event,
    *,
    depth: int = 1,
    name: str = "stoker-stage",
    context: Callable[[], contextlib.AbstractContextManager] | None = None,
) -> Iterator[tuple[Any, Any]]:
    """``(item, func(item))`` for each of ``items``, in order, ``func`` running in a daemon
    thread of its own (``name``, inside ``context()`` there) at most ``depth`` results ahead of
    the reader. An exception in ``func`` is raised here as :class:`StageFailure` (the item and
    the error). ``stop`` set, or this generator closed, stops the thread and waits for it; the
    reader must close it (a ``finally``), as closing is what releases a thread blocked on a
    full queue."""
    q: queue.Queue = queue.Queue(maxsize=max(1, depth))
    halt = threading.Event()  # set when the reader is done: the thread's puts give up

    def run() -> None:
        item = None
        try:
            with context() if context is not None else contextlib.nullcontext():
                for item in items:
                    if stop.is_set() or halt.is_set():
                        return
                    put(q, halt, (item, func(item)))
            put(q, halt, END)
        except Exception as e:  # boundary: the stage thread's error, raised in the reader (Failure) with its item
            put(q, halt, Failure(StageFailure(item, e)))

    worker = threading.Thread(target=run, daemon=True, name=name)
    worker.start()
    try:
        while True:
            try:
                got = q.get(timeout=0.1)
            except queue.Empty:
                if stop.is_set():
                    return  # stopped: the thread puts nothing more
                if not worker.is_alive() and q.empty():  # gone without END: never a short epoch
                    raise StageFailure(None, RuntimeError(f"the {name} thread ended before its last item")) from None
                continue
            if got is END:
                return
            if isinstance(got, Failure):
                raise got.error
            yield got
    finally:
        halt.set()
        if not sys.is_finalizing() and worker is not threading.current_thread():
            worker.join()


class StageClock:
    """Busy seconds per stage of a runner's iterations, and their wall time: how much the stages
    overlapped (their sum over the wall time: 1 run one after another, up to their count when all
    overlapped). Each stage is timed by one thread at a time (the stages may run in different ones).

    Args:
        stages: the stage names.
        sync: called at the end of each timed stage, in its thread (to count a device's queued
            work in: a stream synchronize, on a producer thread, never the consumer's).

    Attributes:
        last: the last iteration's seconds per stage, ``wall``, ``batches``, ``images`` (and
            what :meth:`finish` was given besides).
        totals: the same summed over every iteration.
    """

    def __init__(self, stages: tuple[str, ...], *, sync: Callable[[], None] | None = None):
        self.stages, self.sync = stages, sync
        self.last: dict = {}
        self.totals: dict = dict.fromkeys((*stages, "wall", "batches", "images"), 0)
        self._now: dict = dict.fromkeys(stages, 0.0)

    def start(self) -> None:
        """A new iteration's clock (the last one's stays in :attr:`last`)."""
        self._now = dict.fromkeys(self.stages, 0.0)

    @contextlib.contextmanager
    def time(self, stage: str) -> Iterator[None]:
        """Count the ``with`` block's seconds to ``stage``."""
        t = time.perf_counter()
        try:
            yield
        finally:
            if self.sync is not None:
                self.sync()
            self._now[stage] += time.perf_counter() - t

    def finish(self, wall: float, batches: int, images: int, **extra: Any) -> None:
        """The iteration's end: its wall seconds and counts into :attr:`last` and :attr:`totals`."""
        self.last = {**self._now, "wall": wall, "batches": batches, "images": images}
        for k, v in self.last.items():
            self.totals[k] += v
        self.last.update(extra)

    def ratio(self, seconds: dict | None = None) -> float | None:
        """The stages' busy seconds over the wall seconds in ``seconds`` (default :attr:`last`;
        or :attr:`totals`); None before any wall time."""
        seconds = self.last if seconds is None else seconds
        wall = seconds.get("wall")
        return sum(seconds[k] for k in self.stages) / wall if wall else None


class ProducerThread:
    """Bookkeeping of a runner's producer thread (``_stop`` event, ``_worker`` thread)."""

    _stop: threading.Event | None = None
    _worker: threading.Thread | None = None

    def _run_producer(self, produce: Callable[..., None], args: tuple, *, prefetch: int, name: str) -> Iterator[Any]:
        """Start ``produce(*args, out_q, stop)`` in a daemon thread and yield what it puts on
        ``out_q`` until :data:`END`; a :class:`Failure` it puts is raised here. Closing this
        generator (an abandoned iteration) stops the thread and waits for it."""
        out_q: queue.Queue = queue.Queue(maxsize=max(1, prefetch - 1))
        stop = threading.Event()
        worker = threading.Thread(target=produce, args=(*args, out_q, stop), daemon=True, name=name)
        self._stop, self._worker = stop, worker
        worker.start()
        try:
            while True:
                item = out_q.get()
                if item is END:
                    return
                if isinstance(item, Failure):
                    raise item.error
                yield item
        finally:
            self._halt(stop, worker)

    def _halt(self, stop: threading.Event, worker: threading.Thread) -> None:
        """Stop the producer thread and wait for it."""
        stop.set()
        # While the interpreter finalizes, a daemon thread can no longer run: joining it would
        # hang. The atexit hook below has already stopped it in that case.
        if not sys.is_finalizing() and worker is not threading.current_thread():
            worker.join()
        if self._worker is worker:
            self._stop = self._worker = None

    def shutdown(self) -> None:
        """Stop an abandoned iteration's producer (at exit: before DALI or CUDA tear down)."""
        stop, worker = self._stop, self._worker
        if stop is not None and worker is not None:
            self._halt(stop, worker)


#: runners alive in this process (weak: a runner goes with its Loader); each has ``shutdown()``
_RUNNERS: weakref.WeakSet[Any] = weakref.WeakSet()


def _shutdown_runners() -> None:
    for runner in list(_RUNNERS):
        try:
            runner.shutdown()
        except Exception:  # boundary: interpreter exit, nobody is left to report to; never print a traceback here
            pass


def stop_at_exit(runner: Any) -> None:
    """Stop ``runner`` (its ``shutdown()``) at interpreter exit. Called after DALI, CUDA or a
    DataLoader's workers register their own exit hooks: atexit handlers run last-registered
    first, so the hook is moved to the end each time and runners stop before those libraries
    tear down under them."""
    _RUNNERS.add(runner)
    atexit.unregister(_shutdown_runners)
    atexit.register(_shutdown_runners)


__all__ = ["END", "Failure", "ProducerThread", "StageClock", "StageFailure", "ahead", "put", "stop_at_exit"]
