"""Test subprocesses of stoker's commands without paying the imports each time.

Every ``stoker`` command that touches torch spends ~3 s importing torch, torchvision and DALI
before it does anything, and the multiprocessing fork server of its workers ~3 s more; the docs
run a few dozen such commands and the benchmarks' tests many ``python -m stoker...`` processes.
This server imports them once and starts one multiprocessing fork server (which every command's
workers share), then forks one child per command (the zygote pattern). The client
(:data:`CLIENT`, the docs shell blocks' ``stoker`` and ``python``, and ``sys.executable`` of a test
that asks for it: the ``fast_python`` fixture) sends its argv, working directory, environment and
its stdin/stdout/stderr file descriptors over a Unix socket and exits with the child's status.
The child runs the module as ``python -m`` would (``stoker``: its ``__main__``, what the console
script runs), its own ``sys.executable`` the client, so the processes a command starts (a bench
row, a benchmark's runs) are forked too. Without the server (``STOKER_TEST_COMMAND_SERVER``
unset or unreachable) the client runs ``python -m ...`` itself. A client killed (a timeout)
takes its command's process group with it.

Run as ``python command_server.py SOCKET``; it prints ``ready`` once listening and exits when
its parent (the test session) is gone.
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import signal
import socket
import sys
import threading
import traceback

#: the shell blocks' ``stoker`` and ``python`` (``{python}``: this interpreter): ``stoker ARGS`` and
#: ``python -m stoker[.MODULE] ARGS`` go to the server, any other python command to the interpreter
CLIENT = """#!{python} -S
# The tests' `stoker` (and `python`): this checkout's commands, forked from a server that
# imported torch once (tests/command_server.py).
import json, os, socket, sys

args = sys.argv[1:]  # what the interpreter runs without the server
module = script = None
# launchers too (torchrun, its ranks, a script that starts its own ranks) when the test asks
launchers = os.environ.get("STOKER_TEST_COMMAND_SERVER_LAUNCHERS") == "1"
rest = args[1:] if args[:1] == ["-u"] else args  # torchrun starts its ranks as `python -u ...`
if os.path.basename(sys.argv[0]) == "stoker":
    module, argv, path0 = "stoker", args, None  # the console script: its folder, not the cwd, on sys.path
    args = ["-m", "stoker", *args]
elif rest[:1] == ["-m"] and len(rest) > 1 and (
    rest[1].split(".")[0] == "stoker" or (launchers and rest[1] == "torch.distributed.run")
):
    module, argv, path0 = rest[1], rest[2:], os.getcwd()  # python -m: the cwd first on sys.path
elif launchers and rest[:1] and rest[0].endswith(".py"):
    script = os.path.abspath(rest[0])
    argv, path0 = rest[1:], os.path.dirname(script)  # python SCRIPT: its folder first on sys.path
else:
    os.execv(sys.executable, [sys.executable, *args])
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    sock.connect(os.environ.get("STOKER_TEST_COMMAND_SERVER") or "")
except OSError:
    os.execv(sys.executable, [sys.executable, *args])
request = {{"module": module, "script": script, "argv": argv, "path0": path0, "cwd": os.getcwd(),
           "env": dict(os.environ), "python": os.path.join(os.path.dirname(os.path.abspath(sys.argv[0])), "python")}}
request = json.dumps(request).encode()
socket.send_fds(sock, [len(request).to_bytes(8, "big")], [0, 1, 2])
sock.sendall(request)
status = b""
while len(status) < 4:
    chunk = sock.recv(4 - len(status))
    if not chunk:
        sys.exit("stoker: the test command server's child died without an exit status")
    status += chunk
sys.exit(int.from_bytes(status, "big", signed=True))
"""

#: imported once by the server (what a command would import first); a missing one is skipped
WARM = (
    "torch",
    "torchvision",
    "numpy",
    "PIL.Image",
    "nvidia.dali",
    "stoker.tools.cli",
    "stoker.pipeline.loader",
    "stoker.model.train.loop",
    "stoker.tools.diagnose.command",
)


def routed(server: tuple, monkeypatch, launchers: bool = False) -> None:
    """``sys.executable`` and the environment of this test process pointed at ``server`` (the
    ``command_server`` fixture's ``(folder, socket)``), through ``monkeypatch``; nothing when the
    server did not start. ``launchers``: ``python -m torch.distributed.run`` and ``python
    SCRIPT.py`` (torchrun, the ranks it starts, a script that starts its own) fork from the
    server too, not only stoker's commands."""
    folder, socket_path = server
    if socket_path is not None:
        monkeypatch.setattr(sys, "executable", os.path.join(folder, "python"))
        monkeypatch.setenv("STOKER_TEST_COMMAND_SERVER", socket_path)
        if launchers:
            monkeypatch.setenv("STOKER_TEST_COMMAND_SERVER_LAUNCHERS", "1")


def _recv_exactly(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the client went away")
        data += chunk
    return data


def _child(conn: socket.socket) -> None:
    """Run one command in this forked child, send its status, exit. Never returns."""
    code = 1
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.setsid()  # its own group: killed as a whole when the client goes away
        header, fds, _, _ = socket.recv_fds(conn, 8, 3)
        request = json.loads(_recv_exactly(conn, int.from_bytes(header, "big")))
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = [request["script"] or request["module"], *request["argv"]]
        sys.executable = request["python"]  # the processes it starts (a bench row, a benchmark's runs): forked too
        _share_the_worker_server()
        if request["path0"]:
            sys.path.insert(0, request["path0"])

        def watch() -> None:  # a client killed (a test's timeout) takes its command with it
            try:
                conn.recv(1)
            finally:
                os.killpg(0, signal.SIGKILL)

        threading.Thread(target=watch, daemon=True).start()
        try:
            if request["script"]:
                runpy.run_path(request["script"], run_name="__main__")
            else:
                runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as e:
            code = e.code
        if code is None:
            code = 0
        elif not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            atexit._run_exitfuncs()  # as a process's exit would: worker pools joined, files flushed
        except BaseException:
            traceback.print_exc()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        try:
            conn.sendall(int(code).to_bytes(4, "big", signed=True))
        finally:
            os._exit(int(code) & 0xFF)


def _start_the_worker_server() -> None:
    """stoker's worker fork server, started here with what this server imported: every command's
    workers fork from it (each command would start its own and import torch into it again)."""
    try:
        from stoker.pipeline.workers import _start_fork_server_deaf_to_ctrl_c, context

        _start_fork_server_deaf_to_ctrl_c(context())
    except Exception:  # correct without it, only slower
        traceback.print_exc()


def _share_the_worker_server() -> None:
    """In a child: use the server's worker fork server. multiprocessing asks whether its fork
    server lives with ``waitpid``, which only its parent (this server) may call: ask the kernel."""
    from multiprocessing import forkserver, resource_tracker

    shared = forkserver._forkserver
    pid = shared._forkserver_pid
    if pid is None:
        return
    own = type(shared).ensure_running.__get__(shared)

    def ensure_running() -> None:
        try:
            os.kill(pid, 0)
        except OSError:  # gone: a server of its own
            shared._forkserver_pid = shared._forkserver_address = shared._forkserver_alive_fd = None
            return own()
        resource_tracker.ensure_running()

    shared.ensure_running = forkserver.ensure_running = ensure_running


def serve(path: str) -> None:
    import importlib

    for name in WARM:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    _start_the_worker_server()
    parent = os.getppid()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(16)
    server.settimeout(1.0)
    signal.signal(signal.SIGTERM, lambda *_: _exit())
    print("ready", flush=True)
    while os.getppid() == parent:
        _reap()
        try:
            conn, _ = server.accept()
        except TimeoutError:
            continue
        conn.settimeout(None)
        if os.fork() == 0:
            server.close()
            _child(conn)
        conn.close()
    _exit()


def _reap(block: bool = False) -> None:
    """Wait for the finished children (so their CPU time counts in the test session's)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, 0 if block else os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _exit() -> None:
    from multiprocessing import forkserver, resource_tracker

    # the worker fork server and the resource tracker end once every holder of their pipes let go
    forkserver._forkserver._stop()
    resource_tracker._resource_tracker._stop()
    _reap(block=True)
    os._exit(0)


if __name__ == "__main__":
    serve(sys.argv[1])
