"""One part of the GPU check in a process of its own, within a time box.

The parent (:func:`run_part`) starts ``python -m stoker.benchmarks.gpu_check.steps PART CTX``,
waits at most the part's time box and kills its whole process group after it. The child
(:func:`run_child`) runs the part function and keeps the part's record (``status``,
``result``, ``error`` or ``why``) in ``OUT/parts/PART.json`` as it goes (a part calls
``save(result)`` for what it finished so far), so a part killed at its box's end keeps what
it had finished. A part raises :class:`Skip` when it does not apply here, TimeoutError when
its own box is spent.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from stoker.pipeline.fsutil import atomic_write

#: a part: ``part(ctx, save) -> result``
PartFunc = Callable[[dict, Callable[[dict], None]], dict]


class Skip(Exception):
    """A part that does not apply here; the message says why."""


def time_left(ctx: dict) -> float:
    """Seconds this part has left, less a margin to write its record before the parent's box closes."""
    left = ctx["started"] + ctx["limit"] - min(5.0, 0.1 * ctx["limit"]) - time.time()
    if left <= 0:
        raise TimeoutError(f"no time left in its {ctx['limit']:.0f} s time box")
    return left


def one_line(e: BaseException) -> str:
    """``e`` as one line: its type and message, at most 300 characters."""
    from stoker.errors import one_line as line

    return line(e, with_type=True, limit=300)


def run_group(cmd: list, *, timeout: float, cwd=None) -> subprocess.CompletedProcess:
    """``subprocess.run`` in its own process group, killed as a whole on timeout."""
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        raise TimeoutError(f"`{' '.join(map(str, cmd[:6]))} ...` ran past {timeout:.2g} s") from None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def kill_group(proc: subprocess.Popen) -> None:
    """Kill ``proc``'s whole process group (it was started in a session of its own) and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.communicate()


def write_json(path: Path, obj: dict) -> None:
    """Write ``obj`` as JSON into ``path`` atomically: a reader never sees half a file."""
    with atomic_write(path, "w") as f:
        f.write(json.dumps(obj, indent=1, default=str))


def run_child(parts: Mapping[str, PartFunc], argv: list[str]) -> None:
    """Run one part in this process (``argv``: its name, its ctx as JSON), keeping its record."""
    name, ctx = argv[0], json.loads(argv[1])
    path = Path(ctx["record"])
    last: dict = {}

    def save(result: dict) -> None:
        last.clear()
        last.update(result)
        write_json(path, {"status": "running", "result": result})

    try:
        result = parts[name](ctx, save)
    except Skip as e:
        write_json(path, {"status": "skipped", "why": str(e)})
        return
    except TimeoutError as e:  # the part's own time box (a subprocess it ran, settings left out)
        write_json(path, {"status": "timeout", "error": one_line(e), "result": dict(last) or None})
        sys.exit(1)
    except BaseException as e:  # boundary: the part's process; recorded, its traceback in the part's log
        import traceback

        traceback.print_exc()
        write_json(path, {"status": "failed", "error": one_line(e), "result": dict(last) or None})
        sys.exit(1)
    write_json(path, {"status": "ok", "result": result})
    print(f"{name}: finished {time.time() - ctx['started']:.1f} s into its box; exiting", flush=True)


def run_part(name: str, ctx: dict, limit: float, out: Path) -> dict:
    """Run one part in a child process within ``limit`` seconds; its record, never raising."""
    record = out / "parts" / f"{name}.json"
    record.unlink(missing_ok=True)
    log = out / "logs" / f"{name}.log"
    ctx = {**ctx, "record": str(record), "limit": limit, "started": time.time()}
    t = time.monotonic()
    cmd = [sys.executable, "-m", "stoker.benchmarks.gpu_check.steps", name, json.dumps(ctx)]
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=limit)
            timed_out = False
        except subprocess.TimeoutExpired:
            kill_group(proc)
            timed_out = True
    seconds = time.monotonic() - t
    try:
        rec = json.loads(record.read_text())
    except (OSError, ValueError):
        rec = {"status": "failed", "result": None}
    if timed_out and rec.get("status") == "ok":  # its work was done: only its exit hung
        rec["why"] = f"finished, but its process had not exited when its {limit:.0f} s box closed"
    elif timed_out:
        rec = {
            "status": "timeout",
            "error": f"ran past its {limit:.0f} s time box (partial results kept)",
            "result": rec.get("result"),
        }
    elif rec["status"] == "running" or (proc.returncode and rec["status"] not in ("failed", "timeout")):
        lines = log.read_text(errors="replace").strip().splitlines()
        rec = {
            "status": "failed",
            "result": rec.get("result"),
            "error": f"exited {proc.returncode}: " + (lines[-1][:250] if lines else "no output"),
        }
    rec["seconds"] = round(seconds, 1)
    rec["log"] = str(log)
    return rec
