"""``stoker pack --engine ray``: the image work of a pack as Ray tasks.

Decoding, resizing and re-encoding (``sanitize``) is nearly all of a pack's CPU
time; Ray tasks do it on every core of a cluster, a chunk of inputs per task.
The driver keeps everything that decides the output bytes: it takes the results
back in input order and writes shards, journal and manifests exactly as the
default engine does, so the output is byte-identical and a killed run resumes
from the same journal. A task whose worker dies (a lost node, an OOM kill) is
retried by Ray (``MAX_RETRIES``).

SRC must be readable at the same path on every node (a shared filesystem), and
stoker installed there (or shipped with Ray's ``runtime_env``).
"""

from __future__ import annotations

import collections
import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

from stoker.errors import InputFailedError, MissingExtraError, RayError, arg, one_line

from .sanitize import Sanitized, Settings
from .sources import Item, Job, Source, sanitize_item

MAX_RETRIES = 3  # times Ray reruns a task whose worker died
PROBE_TIMEOUT = 10.0  # seconds to connect to --ray-address before giving up
CHUNK = 16  # images per task: amortizes Ray's per-task overhead (~1 ms)


def import_ray() -> Any:
    """``ray``, or a one-line :class:`MissingExtraError` naming the extra."""
    try:
        import ray
    except ImportError:
        raise MissingExtraError(
            f"{arg('engine', 'ray')} needs Ray, which is not installed: pip install stoker[ray]"
        ) from None
    return ray


@contextlib.contextmanager
def session(address: str | None, num_cpus: int) -> Iterator[None]:
    """Connect to the Ray cluster at ``address`` (``"auto"``, ``"ray://host:10001"``), or
    start a local one with ``num_cpus`` CPUs; shut it down on exit. A Ray already
    initialized in this process (a notebook, a test) is used as it is and left running."""
    ray = import_ray()
    if ray.is_initialized():
        yield
        return
    if address:
        _probe(address)
    kw: dict[str, Any] = {"include_dashboard": False, "logging_level": logging.WARNING, "configure_logging": True}
    try:
        if address:
            ray.init(address=address, **kw)
        else:
            ray.init(num_cpus=num_cpus, **kw)
    except Exception as e:  # boundary: Ray's start-up failure, raised as one RayError line
        where = f"the Ray cluster at {address}" if address else "a local Ray"
        raise RayError(f"cannot start or reach {where}: {one_line(e)}") from None
    try:
        yield
    finally:
        ray.shutdown()


def _probe(address: str) -> None:
    """Fail in seconds when nothing listens at a ``host:port`` / ``ray://host:port`` address
    (``ray.init`` itself waits minutes for an unreachable cluster)."""
    import socket

    hostport = address.split("://", 1)[-1].rstrip("/")
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        return  # "auto", "local": Ray resolves those itself, quickly
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=PROBE_TIMEOUT).close()
    except OSError as e:
        raise RayError(
            f"cannot reach the Ray cluster at {address}: {e.strerror or e} (is the head node up? "
            f"`ray start --head` prints its address)"
        ) from None


def _run_chunk(fn: Callable[..., Sanitized], chunk: list[Job], settings: Settings) -> list[Sanitized]:
    """The Ray task: sanitize a chunk of inputs (``fn`` is :func:`~.sources.base.sanitize_item`)."""
    out = []
    for job in chunk:
        try:
            out.append(fn(job, settings))
        except Exception as e:  # boundary: a Ray task's error, raised on the driver as InputFailedError
            raise InputFailedError(job.where, one_line(e, with_type=True)) from None
    return out


class RaySanitizer:
    """Sanitizes items in input order with Ray tasks, a bounded window in flight (about
    two tasks per cluster CPU), so memory stays flat however long the list. The same
    interface as the default engine's process pool: ``with ...: for res in s.results(items)``."""

    def __init__(self, settings: Settings, source: Source, *, chunk: int | None = None):
        self.settings, self.source, self.chunk = settings, source, chunk or CHUNK
        self.fn = sanitize_item  # looked up now: the function the tasks run, replaceable in tests

    def __enter__(self) -> RaySanitizer:
        return self

    def __exit__(self, *exc) -> None:
        pass

    def results(self, items: list[Item]) -> Iterator[Sanitized]:
        ray = import_ray()
        task = ray.remote(max_retries=MAX_RETRIES)(_run_chunk)
        fn_ref, settings_ref = ray.put(self.fn), ray.put(self.settings)
        window = 2 * max(1, int(ray.cluster_resources().get("CPU", 1)))
        chunks = (self.source.jobs(items[i : i + self.chunk]) for i in range(0, len(items), self.chunk))
        pending: collections.deque = collections.deque()
        try:
            for c in chunks:
                pending.append((task.remote(fn_ref, c, settings_ref), c))
                if len(pending) >= window:
                    break
            while pending:
                ref, chunk = pending.popleft()
                res = self._get(ray, ref, [job.where for job in chunk])
                nxt = next(chunks, None)
                if nxt is not None:
                    pending.append((task.remote(fn_ref, nxt, settings_ref), nxt))
                yield from res
        finally:
            for ref, _ in pending:  # stopped early (an error, Ctrl-C): drop the rest
                with contextlib.suppress(Exception):
                    ray.cancel(ref, force=True)

    @staticmethod
    def _get(ray: Any, ref: Any, paths: list[str]) -> list[Sanitized]:
        try:
            return ray.get(ref)
        except ray.exceptions.RayTaskError as e:
            cause = getattr(e, "cause", None)
            if isinstance(cause, InputFailedError):
                what = f"{cause.path} failed: {cause.why}"
            else:
                what = f"{paths[0]} (and {len(paths) - 1} more) failed: {one_line(cause or e)}"
            raise RayError(
                f"a Ray task packing {what}; rerun the same command to resume (finished shards are kept)"
            ) from None
        except ray.exceptions.RayError as e:
            raise RayError(
                f"a Ray task packing {paths[0]} (and {len(paths) - 1} more) was lost "
                f"{MAX_RETRIES + 1} times ({type(e).__name__}); rerun the same command to resume "
                f"(finished shards are kept)"
            ) from None
