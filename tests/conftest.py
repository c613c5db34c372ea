import os
from pathlib import Path

if os.environ.get("PYTEST_XDIST_WORKER"):
    # Test processes share the cores (make test: three on two): torch's OpenMP threads, one per core
    # in each, spin against each other (a docs block's training ran 4x slower). One thread each,
    # set before torch is imported; the tests' subprocesses inherit it.
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import select
import signal
import subprocess
import sys
import warnings

import pytest

from command_server import CLIENT, routed
from helpers import write_split
from stoker.pipeline.deps import has_cuda
from storage_servers import S3Server, s3_server


def pytest_collection_modifyitems(config, items):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        _heavy_files_first(items)
    if has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Ctrl-C as this process had it before each test, after it: a process of the suite that ends
    up ignoring SIGINT hands that to every command a later test starts, and the Ctrl-C tests fail
    together. Put back, and said, naming the test. (A suite started with Ctrl-C ignored is put
    right once at start: :func:`_take_ctrl_c`.)"""
    before = signal.getsignal(signal.SIGINT)
    yield
    if signal.getsignal(signal.SIGINT) is not before or _ignores_ctrl_c():
        signal.signal(signal.SIGINT, before if callable(before) else signal.default_int_handler)
        item.warn(pytest.PytestWarning(f"{item.nodeid} left this process's Ctrl-C changed; put back"))


def _ignores_ctrl_c() -> bool:
    """Whether this process ignores SIGINT in the kernel (a library may set it without Python knowing)."""
    try:
        with open("/proc/self/status") as f:
            mask = next(int(line.split()[1], 16) for line in f if line.startswith("SigIgn:"))
    except (OSError, StopIteration):
        return False
    return bool(mask & (1 << (signal.SIGINT - 1)))


def _take_ctrl_c() -> None:
    """A suite started as a background job of a non-interactive shell (``make test &``, a script's
    ``cmd &``) starts with Ctrl-C ignored, as bash starts such jobs, and every process it starts
    inherits that: the Ctrl-C tests' commands would ignore the Ctrl-C they are sent. The suite
    takes Ctrl-C as a terminal's process does (Python's handler), in its main process and each
    xdist worker."""
    if _ignores_ctrl_c():
        signal.signal(signal.SIGINT, signal.default_int_handler)


_take_ctrl_c()


def _heavy_files_first(items: list) -> None:
    """Under xdist (``--dist loadfile --no-loadscope-reorder``, pyproject): the test files in the
    order the processes take them, those with the most ``slow`` tests first, then the most tests.

    A file runs whole in one process, so the last file started ends the suite: a heavy file of
    few tests taken last (xdist's own order is by test count) ran alone for a minute at the end
    while the other process sat idle. The order within a file stays (a docs page's blocks run in
    page order). Every process computes the same order from the same collection, as xdist needs.
    """
    files: dict[str, list] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::", 1)[0], []).append(item)

    def weight(name: str) -> tuple[int, int]:
        tests = files[name]
        return sum(1 for t in tests if t.get_closest_marker("slow")), len(tests)

    items[:] = [item for name in sorted(files, key=weight, reverse=True) for item in files[name]]


@pytest.fixture
def tiny_shards(tmp_path):
    """``tiny_shards(n=50, per_shard=16, val=0)`` → dataset root with ``train/`` (and ``val/``)."""

    def make(n: int = 50, per_shard: int = 16, val: int = 0, seed: int = 0) -> Path:
        root = tmp_path / "data"
        write_split(root / "train", num_samples=n, samples_per_shard=per_shard, seed=seed)
        if val:
            write_split(root / "val", num_samples=val, samples_per_shard=per_shard, seed=seed + 1)
        return root

    return make


@pytest.fixture(scope="session")
def s3_session() -> S3Server:
    """One moto S3 server for the whole session (started on first use)."""
    pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    with s3_server() as server:
        yield server


@pytest.fixture
def s3(s3_session, monkeypatch, tmp_path) -> S3Server:
    """The S3 server, with the AWS_* variables pointing every client at it and stoker's cache
    (pack staging) under tmp_path. Make a bucket with ``s3.bucket()``."""
    for k, v in s3_session.env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("STOKER_CACHE_DIR", str(tmp_path / "stoker-cache"))
    return s3_session


@pytest.fixture(scope="session")
def command_server(tmp_path_factory):
    """``(folder, socket)``: a folder of clients (``stoker``, ``python``, ``python3``) whose
    ``stoker`` and ``python -m stoker...`` fork from one server that imported torch once
    (command_server.py); ``socket`` is None when it could not start (the clients then run
    ``python -m ...`` themselves)."""
    folder = tmp_path_factory.mktemp("command-bin")
    for name in ("stoker", "python", "python3"):
        (folder / name).write_text(CLIENT.format(python=sys.executable))
        (folder / name).chmod(0o755)
    socket_path = folder / "stoker.sock"
    server_py = Path(__file__).with_name("command_server.py")
    server = subprocess.Popen(
        [sys.executable, str(server_py), str(socket_path)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    ready = select.select([server.stdout], [], [], 120)[0] and server.stdout.readline().strip() == "ready"
    if not ready:  # correct without it, only slower
        warnings.warn("the test command server did not start: each `stoker` imports torch itself", stacklevel=1)
    yield folder, (str(socket_path) if ready else None)
    server.terminate()
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


@pytest.fixture
def fast_python(command_server, monkeypatch):
    """For a test whose code under test starts ``sys.executable -m stoker...`` processes (the
    benchmarks, bench's rows): those fork from the command server instead of importing torch
    each. Not for a test that signals or waits on such a process by its pid (the client stands
    between them). A module-scoped fixture uses :func:`command_server.routed` itself."""
    routed(command_server, monkeypatch)


@pytest.fixture
def fast_launchers(command_server, monkeypatch):
    """:func:`fast_python`, and ``python -m torch.distributed.run`` and ``python SCRIPT.py`` fork
    from the server too: torchrun, the ranks it starts, and a test's script that starts its own
    (Lightning's DDP). A launched process killed as a group (``helpers.run_in_group``) takes its
    forked command with it."""
    routed(command_server, monkeypatch, launchers=True)
