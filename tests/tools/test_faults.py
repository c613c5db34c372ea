"""Faults in `stoker pack`, `stoker verify` and `stoker index`: a worker process that dies (kill -9,
the OOM killer, a crash in a codec) ends the command within seconds with one line naming what it
was working on, its signal and how to resume; a full disk is one line too; the rerun finishes as
if nothing happened."""

import errno
import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stoker.tools.cli import main as cli
from stoker.tools.common.synth import make_image_folder

# Imported by the stoker command below and by its worker processes (PYTHONPATH): the work of one
# input or shard blocks forever, after writing its worker's pid, so the test can kill that worker.
BLOCKMOD = """
import os, time
from stoker.tools.pack.sources import sanitize_item as _sanitize_item
from stoker.tools.verify.command import _verify_job
from stoker.tools.verify.indexing import index_one as _index_one


def _block(what):
    if os.environ["BLOCK_ON"] in repr(what):
        pidfile = os.environ["BLOCK_PIDFILE"]
        with open(pidfile + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace(pidfile + ".tmp", pidfile)
        time.sleep(3600)


def sanitize_item(job, settings):
    _block(job.rel)
    return _sanitize_item(job, settings)


def verify_job(*args):
    _block(args)
    return _verify_job(*args)


def index_one(*args):
    _block(args)
    return _index_one(*args)
"""

BLOCKING_STOKER = """
import faulthandler, signal, sys
faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test's stack dump if it hangs
import blockmod
import stoker.tools.pack.engine as engine
import stoker.tools.verify.command as command
import stoker.tools.verify.indexing as indexing
engine.sanitize_item = blockmod.sanitize_item
command._verify_job = blockmod.verify_job
indexing.index_one = blockmod.index_one
from stoker.tools.cli import main
if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
"""


def tree_sha(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def run_and_kill_the_blocked_worker(
    tmp_path: Path, block_on: str, argv: list[str], signal_command: int | None = None
) -> tuple[int, str, float]:
    """Run ``stoker ARGV`` with the work on ``block_on`` blocking, kill -9 the worker that holds
    it (or send ``signal_command`` to the command's process group, as a terminal's Ctrl-C does: the
    command, its fork server and its workers); ``(exit status, stderr, seconds from the kill to the
    exit, its output pipes closed)``."""
    (tmp_path / "blockmod.py").write_text(BLOCKMOD)
    (tmp_path / "blocking_stoker.py").write_text(BLOCKING_STOKER)
    pidfile = tmp_path / "blocked.pid"
    env = {
        **os.environ,
        "BLOCK_ON": block_on,
        "BLOCK_PIDFILE": str(pidfile),
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
    }
    cmd = [sys.executable, str(tmp_path / "blocking_stoker.py"), *argv]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 120
        while not pidfile.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no worker reached the blocking input"
            time.sleep(0.05)
        if signal_command is None:
            os.kill(int(pidfile.read_text()), signal.SIGKILL)
        else:
            os.killpg(proc.pid, signal_command)
        killed = time.monotonic()
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGUSR1)
            time.sleep(1)
            proc.kill()
            raise AssertionError(f"stoker did not exit after the kill:\n{proc.communicate()[1]}") from None
        return proc.returncode, err, time.monotonic() - killed
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("dead-workers") / "src"
    make_image_folder(root, classes=("circles", "rings"), per_class=12, min_side=32, max_side=96)
    return root


def test_a_killed_pack_worker_ends_the_pack_in_seconds_and_the_rerun_is_byte_identical(tmp_path, src):
    block = sorted((src / "rings").iterdir())[5].name
    argv = ["pack", str(src), str(tmp_path / "out"), "-q", "--workers", "2", "--samples-per-shard", "4"]
    rc, err, seconds = run_and_kill_the_blocked_worker(tmp_path, block, argv)
    assert rc == 1, err
    assert seconds < 15
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "a worker process died (SIGKILL" in lines[0]
    assert f"while sanitizing {src / 'rings' / block};" in lines[0]
    assert "rerun the same command to resume" in lines[0]
    assert not (tmp_path / "out" / "train" / "stoker.json").exists()  # nothing looks finished

    assert cli(argv) == 0  # the rerun resumes
    assert cli(["pack", str(src), str(tmp_path / "clean"), "-q", "--workers", "2", "--samples-per-shard", "4"]) == 0
    assert tree_sha(tmp_path / "out") == tree_sha(tmp_path / "clean")


def alive(pid: int) -> bool:
    """``pid`` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def test_ctrl_c_stops_pack_and_its_workers_at_once(tmp_path, src):
    block = sorted((src / "rings").iterdir())[2].name
    argv = ["pack", str(src), str(tmp_path / "out"), "-q", "--workers", "2", "--samples-per-shard", "4"]
    rc, err, seconds = run_and_kill_the_blocked_worker(tmp_path, block, argv, signal.SIGINT)
    assert (rc, err.strip()) == (130, "stoker pack: interrupted; rerun the same command to resume")
    assert seconds < 15
    worker = int((tmp_path / "blocked.pid").read_text())
    deadline = time.monotonic() + 10
    while alive(worker):
        assert time.monotonic() < deadline, "the blocked worker outlived the pack"
        time.sleep(0.05)


def _ignores_ctrl_c(pid: int) -> bool:
    """Whether process ``pid`` ignores SIGINT now (its SigIgn mask in /proc)."""
    with open(f"/proc/{pid}/status") as f:
        mask = next(int(line.split()[1], 16) for line in f if line.startswith("SigIgn:"))
    return bool(mask & (1 << (signal.SIGINT - 1)))


def _children(pid: int) -> list[tuple[int, str]]:
    """``(pid, command line)`` of ``pid``'s child processes (Linux /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid == pid:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    found.append((int(entry), f.read().replace(b"\0", b" ").decode()))
        except (OSError, ValueError, IndexError):
            continue
    return found


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc")
def test_ctrl_c_while_the_fork_server_starts_is_one_line(tmp_path, src):
    # a terminal's Ctrl-C reaches the whole process group: the fork server, still importing its
    # preloads, must not print a traceback of its own (nor die and fail the next worker's start)
    cmd = [sys.executable, "-m", "stoker", "pack", str(src), str(tmp_path / "out"), "-q", "--workers", "2"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not any("forkserver" in c for _, c in _children(proc.pid)) or _ignores_ctrl_c(proc.pid):
            # the command is deaf to Ctrl-C for the instant of the server's fork and exec (by design:
            # the server must not inherit a handler): the Ctrl-C of this test comes after it
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.002)
        time.sleep(0.1)  # past the interpreter's start: the server imports its preloads
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert (proc.returncode, err.strip()) == (130, "stoker pack: interrupted; rerun the same command to resume")
    assert cli(cmd[3:]) == 0  # the rerun finishes it


def test_a_killed_pack_takes_its_workers_with_it(tmp_path, src):
    # a fork server's workers are the server's children: they must not outlive the command, nor
    # hold its output pipes open (a caller reading them would wait forever)
    block = sorted((src / "rings").iterdir())[2].name
    argv = ["pack", str(src), str(tmp_path / "out"), "-q", "--workers", "2", "--samples-per-shard", "4"]
    rc, _, seconds = run_and_kill_the_blocked_worker(tmp_path, block, argv, signal.SIGKILL)
    assert rc == -signal.SIGKILL and seconds < 15
    worker = int((tmp_path / "blocked.pid").read_text())
    deadline = time.monotonic() + 10
    while alive(worker):
        assert time.monotonic() < deadline, "the blocked worker outlived the killed pack"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def packed(tmp_path_factory, src) -> Path:
    out = tmp_path_factory.mktemp("dead-workers-packed") / "out"
    assert cli(["pack", str(src), str(out), "-q", "--workers", "1", "--samples-per-shard", "4"]) == 0
    return out


@pytest.mark.parametrize("command", ["verify", "index"])
def test_a_killed_verify_or_index_worker_names_its_shard_and_the_rerun_finishes(tmp_path, packed, command):
    split = tmp_path / "train"
    subprocess.run(["cp", "-r", str(packed / "train"), str(split)], check=True)
    argv = [command, str(split), "-q", "--workers", "2"]
    rc, err, seconds = run_and_kill_the_blocked_worker(tmp_path, "train-000002.tar", argv)
    assert rc == 1, err
    assert seconds < 15
    doing = {"verify": "verifying", "index": "indexing"}[command]
    # the signal, where the fork server reported it (under load it may report 255 for the killed one too)
    assert "a worker process died (SIGKILL" in err or "a worker process died (exit status 255)" in err, err
    assert f"while {doing} train-000002.tar" in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert cli(argv) == 0


@pytest.mark.parametrize("command", ["verify", "index"])
def test_a_full_disk_in_verify_or_index_is_one_line_and_the_rerun_finishes(tmp_path, packed, command, capsys):
    split = tmp_path / "train"
    subprocess.run(["cp", "-r", str(packed / "train"), str(split)], check=True)
    real = os.fsync

    def full(fd):  # every file the command writes (journal, .idx, manifest) hits a full disk
        raise OSError(errno.ENOSPC, "No space left on device")

    os.fsync = full
    try:
        capsys.readouterr()
        assert cli([command, str(split), "-q", "--workers", "1"]) == 1
    finally:
        os.fsync = real
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"stoker {command}: disk full writing {split}"), err
    assert err.endswith("free space and rerun the same command (what was finished is kept, nothing written is corrupt)")
    assert cli([command, str(split), "-q", "--workers", "1"]) == 0
