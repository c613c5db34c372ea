"""The suite cannot hang: every test runs under a time limit (pyproject's pytest options), and a
test that hangs fails by name with the stack where it waits, and the run goes on."""

import subprocess
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]

HANGS = """
import threading

def test_waits_forever():
    threading.Event().wait()  # a worker's result that never comes

def test_after_it():
    assert True
"""


def test_every_test_has_a_time_limit_and_a_stack_dump_before_it():
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert 0 < options["faulthandler_timeout"] < options["timeout"] <= 600


def test_a_hanging_test_fails_by_name_and_the_run_goes_on(tmp_path):
    (tmp_path / "test_hangs.py").write_text(HANGS)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-o", "timeout=3", "-q", "test_hangs.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stdout
    assert "Timeout" in proc.stdout and "test_waits_forever" in proc.stdout
    assert "1 failed, 1 passed" in proc.stdout
