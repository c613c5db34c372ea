"""stoker's worker processes (:mod:`stoker.pipeline.workers`): started clean, ordered results, a
bug raises, a dead worker is an error in seconds naming its item, and started from a process that
already runs fsspec's, pyarrow's and torch's threads they neither hang nor crash."""

import functools
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from helpers import block_on, buggy, square, write_split
from stoker.errors import LoaderError, WorkerDiedError
from stoker.pipeline.workers import Workers, start_method


def test_workers_never_fork_and_keep_the_order_of_the_items():
    assert start_method() in ("forkserver", "spawn")
    with Workers(2, doing="squaring", resume="rerun", chunk=3) as pool:
        assert list(pool.map(square, range(20))) == [x * x for x in range(20)]
        unordered = list(pool.map(square, range(10, 20), ordered=False))
    assert sorted(unordered) == [(k, (10 + k) ** 2) for k in range(10)]


def test_a_bug_in_the_work_raises_its_own_error_with_the_workers_traceback():
    with Workers(2, doing="squaring", resume="rerun") as pool, pytest.raises(TypeError) as e:
        list(pool.map(buggy, range(6)))
    assert "buggy" in str(e.value.__cause__)  # the traceback from the worker


def test_the_workers_see_the_environment_and_folder_of_now(tmp_path, monkeypatch):
    with Workers(1, doing="warming", resume="rerun") as pool:  # the fork server starts here
        list(pool.map(square, [1]))
    monkeypatch.setenv("STOKER_TEST_LATE", "set after the fork server started")
    monkeypatch.chdir(tmp_path)
    with Workers(1, doing="reading", resume="rerun") as pool:
        assert list(pool.map(os.getenv, ["STOKER_TEST_LATE"])) == ["set after the fork server started"]
        assert list(pool.map(os.path.abspath, ["x"])) == [str(tmp_path / "x")]


def test_a_killed_worker_is_one_line_naming_its_item_within_seconds(tmp_path):
    pidfile = tmp_path / "pid"
    fn = functools.partial(block_on, target=7, pidfile=str(pidfile))

    def kill_when_blocked():
        while not pidfile.exists():
            time.sleep(0.02)
        os.kill(int(pidfile.read_text()), signal.SIGKILL)

    killer = threading.Thread(target=kill_when_blocked, daemon=True)
    killer.start()
    t0 = time.monotonic()
    with pytest.raises(WorkerDiedError) as e, Workers(2, doing="squaring", resume="rerun it", chunk=2) as pool:
        list(pool.map(fn, range(12), name=lambda x: f"item-{x}"))
    assert time.monotonic() - t0 < 15
    assert str(e.value) == (
        "a worker process died (SIGKILL, as the kernel's out-of-memory killer sends) while squaring item-7; rerun it"
    )


def test_a_killed_pil_worker_is_a_loader_error_not_a_hang(tmp_path):
    from stoker.pipeline.loader import Loader

    write_split(tmp_path / "train", num_samples=64, samples_per_shard=16)
    loader = Loader(tmp_path / "train", batch_size=4, crop=32, backend="pil", threads=2, device="cpu")
    it = iter(loader)
    next(it)
    workers = loader.decoding.runner.dl._iterator._workers  # torch's worker processes
    os.kill(workers[0].pid, signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(LoaderError, match=r"a decode worker process died \(DataLoader worker \(pid"):
        for _ in it:
            pass
    assert time.monotonic() - t0 < 30
    loader.close()


# Run as a script: a process that already runs fsspec's IO loop, pyarrow's pools and torch's
# threads packs and loads ROUNDS times with worker processes.
CTRL_C_ELSEWHERE = """
import functools, os, signal, sys, threading, time
from helpers import block_on
from stoker.pipeline.workers import Workers

if __name__ == "__main__":
    pidfile = sys.argv[1]

    def ctrl_c_to_this_thread():  # as the kernel may do: the signal lands on a thread that is not main
        while not os.path.exists(pidfile):
            time.sleep(0.02)
        time.sleep(1)  # the main thread waits on the hung worker by now
        signal.pthread_kill(threading.get_ident(), signal.SIGINT)

    threading.Thread(target=ctrl_c_to_this_thread, daemon=True).start()
    try:
        with Workers(2, doing="squaring", resume="rerun it") as pool:
            for ordered in (True, False):
                list(pool.map(functools.partial(block_on, target=3, pidfile=pidfile), range(8), ordered=ordered))
    except KeyboardInterrupt:
        sys.exit(130)
"""


def test_ctrl_c_on_another_thread_interrupts_a_wait_on_a_hung_worker(tmp_path):
    # a terminal's Ctrl-C may reach any thread; the main thread, waiting on a worker stuck on its
    # input, must still raise KeyboardInterrupt (it waited forever, and the pack with it)
    (tmp_path / "ctrl_c.py").write_text(CTRL_C_ELSEWHERE)
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")])
    )
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(tmp_path / "ctrl_c.py"), str(tmp_path / "pid")], env=env, capture_output=True, timeout=60
    )
    assert proc.returncode == 130, proc.stderr.decode()[-2000:]
    assert time.monotonic() - t0 < 30


THREADED = """
import sys
from pathlib import Path

import fsspec.asyn
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from stoker.pipeline.loader import Loader
from stoker.tools.pack import Shards, pack

if __name__ == "__main__":
    src, work, rounds = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    fsspec.asyn.get_loop()  # fsspec's IO thread
    pq.write_table(pa.table({"x": np.arange(100_000)}), work / "t.parquet")
    assert pq.read_table(work / "t.parquet", use_threads=True).num_rows == 100_000  # pyarrow's pools
    torch.set_num_threads(2)
    torch.randn(256, 256) @ torch.randn(256, 256)  # torch's intra-op threads
    for k in range(rounds):
        out = work / f"out{k}"
        assert pack(src, out, workers=2, shards=Shards(samples=8)).packed == 24
        loader = Loader(out / "train", batch_size=8, crop=32, backend="pil", threads=2, device="cpu", train=False)
        assert sum(len(y) for _, y in loader) == 24
        loader.close()
    print("rounds", rounds)
"""


def test_pack_and_loader_from_a_threaded_process_20_times_never_hang_or_crash(tmp_path):
    from stoker.tools.common.synth import make_image_folder

    src = make_image_folder(tmp_path / "src", classes=("circles", "rings"), per_class=12, min_side=32, max_side=64)
    (tmp_path / "threaded.py").write_text(THREADED)
    proc = subprocess.run(
        [sys.executable, str(tmp_path / "threaded.py"), str(src), str(tmp_path), "20"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rounds 20" in proc.stdout
    assert "Segmentation" not in proc.stderr and "died" not in proc.stderr


# A script without `if __name__ == "__main__":` that packs and loads with worker processes at
# its top level (as torchrun scripts often do with their process group): the workers do not run
# it again. A script whose work is defined in it gets its workers to import it (guarded there).
UNGUARDED = """
import sys
from stoker.pipeline.loader import Loader
from stoker.tools.pack import pack

print("top level ran")
pack(sys.argv[1], sys.argv[2], workers=2)
loader = Loader(sys.argv[2] + "/train", batch_size=8, crop=32, backend="pil", threads=2, device="cpu", train=False)
print("samples", sum(len(y) for _, y in loader))
"""

OWN_WORK = """
from stoker.pipeline.workers import Workers

def cube(x):
    return x ** 3

if __name__ == "__main__":
    with Workers(2, doing="cubing", resume="rerun") as pool:
        print(list(pool.map(cube, range(5))))
"""


def test_an_unguarded_script_is_not_run_again_by_the_workers(tmp_path):
    from stoker.tools.common.synth import make_image_folder

    src = make_image_folder(tmp_path / "src", classes=("circles", "rings"), per_class=12, min_side=32, max_side=64)
    (tmp_path / "unguarded.py").write_text(UNGUARDED)
    (tmp_path / "own_work.py").write_text(OWN_WORK)
    run = functools.partial(subprocess.run, capture_output=True, text=True, timeout=120)
    proc = run([sys.executable, str(tmp_path / "unguarded.py"), str(src), str(tmp_path / "out")])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == ["top level ran", "samples 24"]
    proc = run([sys.executable, str(tmp_path / "own_work.py")])
    assert (proc.returncode, proc.stdout) == (0, "[0, 1, 8, 27, 64]\n"), proc.stderr[-3000:]


def test_workers_start_under_a_temp_folder_too_long_for_a_socket(tmp_path):
    """A long TMPDIR (a cluster job's scratch folder) would put the fork server's socket past the
    108 bytes a unix socket path may have: every worker's start failed with "AF_UNIX path too
    long". The socket goes under /tmp instead (a fresh process: the fork server starts there)."""
    long = tmp_path / ("scratch-" + "x" * 60) / ("job-" + "y" * 40)
    long.mkdir(parents=True)
    code = (
        "from helpers import square\n"
        "from stoker.pipeline.workers import Workers\n"
        "with Workers(1, doing='squaring', resume='rerun') as pool:\n"
        "    print(list(pool.map(square, [3])))\n"
    )
    tests = os.path.dirname(os.path.abspath(__file__ + "/.."))
    env = {**os.environ, "TMPDIR": str(long), "PYTHONPATH": tests + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[9]" and len(str(long)) > 107
