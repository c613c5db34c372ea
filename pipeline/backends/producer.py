"""The producer thread the DALI and nvjpeg backends share: it prepares batches ahead while
the caller trains, hands failures to the consumer, and is stopped in order at exit."""

from __future__ import annotations

import atexit
import queue
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
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
        except Exception:  # noqa: BLE001 - exiting anyway; never print a traceback here
            pass


def stop_at_exit(runner: Any) -> None:
    """Stop ``runner`` (its ``shutdown()``) at interpreter exit. Called after DALI, CUDA or a
    DataLoader's workers register their own exit hooks: atexit handlers run last-registered
    first, so the hook is moved to the end each time and runners stop before those libraries
    tear down under them."""
    _RUNNERS.add(runner)
    atexit.unregister(_shutdown_runners)
    atexit.register(_shutdown_runners)


__all__ = ["END", "Failure", "ProducerThread", "put", "stop_at_exit"]
