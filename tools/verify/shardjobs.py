"""The per-shard work of ``stoker index`` and ``stoker verify``: in worker processes on this
machine or as Ray tasks on a cluster (``--engine ray``, as ``stoker pack`` runs), and journaled,
so a killed run resumes where it stopped.

A journal is one JSON line per finished shard, appended and fsynced as each shard finishes,
after a first line holding the run's settings: a rerun with the same settings keeps the shards
whose tar (and ``.idx``) are unchanged (same size and modification time) and does the rest; a
rerun with other settings starts over. The command removes its journal once it has written
its output. Results are plain JSON (what a shard's job returns).

With Ray, the shards must be readable (and for ``stoker index`` writable: each task writes its
shard's ``.idx``) at the same path on every node, as pack's SRC must be.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from stoker.errors import CheckFailedError, RayError, UsageError, arg, one_line

#: times Ray reruns a task whose worker died (a lost node, an OOM kill)
MAX_RETRIES = 3


def stamp(*paths: Path) -> list:
    """``[size, mtime_ns]`` of each path (``None`` for a missing one): what a journaled result
    was computed from."""
    out = []
    for p in paths:
        try:
            st = os.stat(p)
            out.append([st.st_size, st.st_mtime_ns])
        except OSError:
            out.append(None)
    return out


class ShardJournal:
    """Append-only JSON lines at ``path``: the settings, then ``{"shard", "stamp", "result"}``
    per finished shard. ``path`` ``None``: no journal (a folder that cannot be written)."""

    def __init__(self, path: Path | None, settings: dict):
        self.path, self.settings = path, json.loads(json.dumps(settings, default=str))

    def load(self) -> dict[str, dict]:
        """``{shard: {"stamp", "result"}}`` of this run's settings; another run's journal (or a
        damaged one) is removed. A torn last line (a kill mid-write) is dropped."""
        if self.path is None:
            return {}
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        keep = raw[: raw.rfind(b"\n") + 1]
        try:
            records = [json.loads(line) for line in keep.decode("utf-8").splitlines() if line.strip()]
        except ValueError:
            records = []
        if not records or records[0].get("settings") != self.settings:
            self.remove()
            return {}
        if len(keep) != len(raw):
            with open(self.path, "r+b") as f:  # cut the torn line off
                f.truncate(len(keep))
        return {r["shard"]: r for r in records[1:] if "shard" in r}

    def start(self) -> None:
        """Write the settings line of a new journal (when there is none)."""
        if self.path is None or self.path.exists():
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._append({"settings": self.settings})

    def append(self, shard: str, shard_stamp: list, result: dict) -> None:
        if self.path is not None:
            self._append({"shard": shard, "stamp": shard_stamp, "result": result})

    def _append(self, record: dict) -> None:
        try:
            with open(self.path, "ab") as f:
                f.write((json.dumps(record, sort_keys=True) + "\n").encode())
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            if e.filename is None:  # name the journal (ENOSPC from write/fsync carries no name)
                raise OSError(e.errno, e.strerror, str(self.path)) from e
            raise

    def remove(self) -> None:
        """Forget the journal (its folder too, when nothing else is in it)."""
        if self.path is None:
            return
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        with contextlib.suppress(OSError):
            self.path.parent.rmdir()


def journal_at(folder: Path, name: str, settings: dict) -> ShardJournal:
    """The journal ``folder/name/journal.jsonl``, or none when ``folder`` cannot be written."""
    if not os.access(folder, os.W_OK | os.X_OK):
        return ShardJournal(None, settings)
    return ShardJournal(folder / name / "journal.jsonl", settings)


def run_shard_jobs(
    fn: Callable[..., dict],
    jobs: Sequence[tuple],
    shards: Sequence[str],
    stamps: Sequence[list],
    *,
    journal: ShardJournal,
    engine: str = "local",
    workers: int = 1,
    progress: bool = False,
    desc: str = "shards",
    what: str = "checking",
) -> list[dict]:
    """``fn(*job)`` for every job (one per shard, named ``shards``, computed from files with
    ``stamps``), results in job order; a result with an ``error`` stops the run with it (a
    :class:`~stoker.errors.CheckFailedError`). Shards the journal holds with the same stamp are not
    run again; each finished one is journaled at once. ``engine``: ``"local"`` (``workers``
    processes) or ``"ray"`` (Ray tasks on the cluster :func:`ray_session` connected to)."""
    from tqdm import tqdm

    done = journal.load()
    results: dict[int, dict] = {}
    todo = []
    for k, (shard, st) in enumerate(zip(shards, stamps, strict=True)):
        rec = done.get(shard)
        if rec is not None and rec.get("stamp") == st:
            results[k] = rec["result"]
        else:
            todo.append(k)
    journal.start()
    # a bar on a terminal only, as train's and bench's: redirected to a file, \r bars are noise in it
    disable = None if progress else True  # None: tqdm draws only where stderr is a terminal
    bar = tqdm(total=len(jobs), initial=len(results), desc=desc, unit="shard", file=sys.stderr, disable=disable)
    run = _ray_results if engine == "ray" else _local_results
    try:
        for k, result in run(fn, [jobs[k] for k in todo], todo, workers, [shards[k] for k in todo], what):
            if "error" in result:  # a shard that cannot be done at all (e.g. not a tar): stop here
                raise CheckFailedError(result["error"])
            journal.append(shards[k], stamps[k], result)
            results[k] = result
            bar.update(1)
    finally:
        bar.close()
    return [results[k] for k in range(len(jobs))]


def _call(item: tuple) -> tuple[int, dict]:
    fn, k, job = item
    return k, fn(*job)


def _local_results(fn, jobs, keys, workers, names, what) -> Iterator[tuple[int, dict]]:
    items = [(fn, k, job) for k, job in zip(keys, jobs, strict=True)]
    if workers > 1 and len(items) > 1:
        from stoker.pipeline.workers import Workers

        name_of = dict(zip(keys, names, strict=True))
        resume = "rerun the same command to resume (finished shards are kept)"
        with Workers(min(workers, len(items)), doing=what, resume=resume, window=2) as pool:
            for _, result in pool.map(_call, items, ordered=False, name=lambda item: name_of[item[1]]):
                yield result
    else:
        yield from map(_call, items)


def _ray_results(fn, jobs, keys, _workers, names, what) -> Iterator[tuple[int, dict]]:
    """Ray tasks, about two per cluster CPU in flight; results as they finish."""
    from stoker.tools.pack.ray_engine import import_ray

    ray = import_ray()
    task = ray.remote(max_retries=MAX_RETRIES)(fn)
    window = 2 * max(1, int(ray.cluster_resources().get("CPU", 1)))
    waiting = list(zip(keys, jobs, names, strict=True))[::-1]
    running: dict[Any, tuple[int, str]] = {}
    try:
        while waiting or running:
            while waiting and len(running) < window:
                k, job, name = waiting.pop()
                running[task.remote(*job)] = (k, name)
            ready, _ = ray.wait(list(running), num_returns=1)
            k, name = running.pop(ready[0])
            try:
                result = ray.get(ready[0])
            except ray.exceptions.RayTaskError as e:
                cause = getattr(e, "cause", None) or e
                raise RayError(
                    f"a Ray task {what} {name} failed: {one_line(cause, with_type=True)}; "
                    "rerun the same command to resume (finished shards are kept)"
                ) from None
            except ray.exceptions.RayError as e:
                raise RayError(
                    f"a Ray task {what} {name} was lost {MAX_RETRIES + 1} times ({type(e).__name__}); rerun the "
                    "same command to resume (finished shards are kept)"
                ) from None
            yield k, result
    finally:
        for ref in running:  # stopped early (an error, Ctrl-C): drop the rest
            with contextlib.suppress(Exception):
                ray.cancel(ref, force=True)


@contextlib.contextmanager
def engine_session(engine: str, ray_address: str | None, workers: int) -> Iterator[None]:
    """Check ``engine`` and ``ray_address``; with Ray, connect to the cluster (or start a local
    Ray with ``workers`` CPUs) for the run."""
    if engine not in ("local", "ray"):
        raise UsageError(f"{arg('engine')} must be local or ray, got {engine!r}")
    if ray_address and engine != "ray":
        raise UsageError(f"{arg('ray_address')} needs {arg('engine', 'ray')}")
    if engine != "ray":
        yield
        return
    from stoker.tools.pack.ray_engine import session

    with session(ray_address, workers):
        yield


__all__ = ["MAX_RETRIES", "ShardJournal", "engine_session", "journal_at", "run_shard_jobs", "stamp"]
