"""Block mode from a URL: the epoch's batches grouped by window of shards, each window's shards
fetched into the :class:`~.cache.ShardCache` while the previous window trains.

With ``shuffle="block"`` (:func:`.order.block_plan`) a rank reads its shards one window
(``block_shards`` shards) at a time, so a node downloads only its share and the cache holds two
windows: the one training and the one downloading.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator

import numpy as np

from .cache import ShardCache
from .shards.samples import SampleIndex


def group_by_window(batches: list, windows: list, index: SampleIndex) -> list:
    """``[(batches, shard numbers they read)]``, one entry per run of ``batches`` (arrays of
    global sample positions) in the same window of ``windows`` (lists of shard numbers). A batch
    goes with the window of its first sample and may reach into the next one."""
    if not batches:
        return []
    shard_window = np.zeros(len(index.shard_names), np.int64)
    for w, shards in enumerate(windows):
        shard_window[shards] = w
    chunks: list = []
    for b in batches:
        shards = np.unique(np.searchsorted(index.shard_start, b, side="right") - 1)
        w = int(shard_window[index.shard_of(int(b[0]))])
        if not chunks or chunks[-1][0] != w:
            chunks.append((w, [], set()))
        chunks[-1][1].append(b)
        chunks[-1][2].update(shards.tolist())
    return [(group, sorted(shards)) for _, group, shards in chunks]


class Prefetcher:
    """Fetches one window's shards into the cache in a background thread."""

    def __init__(self, cache: ShardCache):
        self.cache = cache
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def start(self, names: list) -> None:
        """Wait for the previous fetch (raising its error), then fetch ``names`` in the background."""
        self.wait()
        if not names:
            return

        def run() -> None:
            try:
                self.cache.ensure(names)
            except BaseException as e:  # boundary: the prefetch thread's error, raised in the consumer by wait()
                self._error = e

        self._thread = threading.Thread(target=run, daemon=True, name="stoker-prefetch")
        self._thread.start()

    def wait(self) -> None:
        """Until the running fetch ends; raises its error, if any."""
        if self._thread is not None:
            self._thread.join()  # downloads end: every storage call has a timeout and few attempts
            self._thread = None
        error, self._error = self._error, None
        if error is not None:
            raise error

    def stop(self) -> None:
        """At the end or on abandon: let a running download finish; its error is dropped."""
        if self._thread is not None and not sys.is_finalizing():
            self._thread.join()
        self._thread, self._error = None, None


def cached_groups(cache: ShardCache | None, batches: list, windows: list | None, index: SampleIndex) -> Iterator[tuple]:
    """``(batches, shard numbers they may read)`` once those shards are local: all of ``batches``
    at once (``None``: any shard) for a local split, or a URL's whole split fetched first
    (``windows`` None), else one run of batches per window of ``windows``, the next window
    fetched in the background. Closing the generator waits for a download in flight."""
    if cache is None:
        yield batches, None
        return
    names = index.shard_names
    if windows is None:
        cache.ensure(names)
        yield batches, None
        return
    chunks = [(group, [names[s] for s in shards]) for group, shards in group_by_window(batches, windows, index)]
    index.max_maps = 2 * max(map(len, windows), default=1) + 2  # maps of evicted shards are closed
    fetched = fetched_windows(cache, chunks)
    try:
        for group, needed in fetched:
            yield group, {names.index(n) for n in needed}
    finally:
        fetched.close()  # a download in flight ends first


def fetched_windows(cache: ShardCache, windows: list) -> Iterator[tuple]:
    """Yield each ``(batches, shard names)`` of ``windows`` once its shards are in ``cache``,
    the next window downloading meanwhile. Shards neither window needs are unpinned (evictable)
    as each window starts. Closing the generator waits for a download in flight."""
    pool = Prefetcher(cache)
    try:
        if windows:
            pool.start(windows[0][1])
        for i, (group, needed) in enumerate(windows):
            pool.wait()  # this window's shards are here (or its download's error is raised)
            ahead = windows[i + 1][1] if i + 1 < len(windows) else []
            cache.unpin(cache.pinned() - set(needed) - set(ahead))  # evictable from now on
            pool.start(ahead)  # the next window downloads while this one trains
            yield group, needed
    finally:
        pool.stop()


__all__ = ["Prefetcher", "cached_groups", "fetched_windows", "group_by_window"]
