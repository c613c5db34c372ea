"""What a user installs: every subpackage is in the wheel's package list (and the research
benchmarks are not), the public surface is where the README says, the house has no import cycles,
and every function of pipeline/, model/ and tools/ (and every module, test modules too) is short
enough to hold in mind."""

import ast
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib

import stoker

ROOT = Path(stoker.__file__).resolve().parent
SKIP_DIRS = {".venv", "build", "tests", "examples", "docs", ".git", "site"}


def _package_folders() -> set[str]:
    found = set()
    for folder, dirs, files in os.walk(ROOT):
        rel = Path(folder).relative_to(ROOT)
        dirs[:] = [d for d in dirs if not (rel == Path(".") and d in SKIP_DIRS) and not d.startswith((".", "__"))]
        if "__init__.py" in files:
            found.add(".".join(("stoker", *rel.parts)))
    return found


def _listed_packages() -> set[str]:
    return set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])


def _is_benchmark(package: str) -> bool:
    return package == "stoker.benchmarks" or package.startswith("stoker.benchmarks.")


def test_every_folder_with_an_init_is_a_listed_package():
    listed = _listed_packages()
    folders = {f for f in _package_folders() if not _is_benchmark(f)}
    assert folders - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"
    assert listed - folders == set(), "these listed packages have no folder with an __init__.py"


def test_the_research_benchmarks_are_not_in_the_wheel():
    # they run from a checkout (python -m stoker.benchmarks.<name>); the wheel carries user commands
    assert {"stoker.benchmarks", "stoker.benchmarks.gpu_check"} <= _package_folders()
    assert {p for p in _listed_packages() if _is_benchmark(p)} == set()


@pytest.mark.slow
def test_the_built_wheel_has_no_benchmarks(tmp_path):
    # built from a copy: setuptools writes build/ and *.egg-info beside the sources
    pytest.importorskip("setuptools")
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(*SKIP_DIRS - {"docs"}, ".*", "__pycache__", "*.egg-info"))
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path)]
    out = subprocess.run([*cmd, str(src)], capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    (wheel,) = tmp_path.glob("stoker-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {"stoker/tools/bench/loader.py", "stoker/tools/bench/peers/timing.py", "stoker/tools/cli.py"} <= set(names)
    assert [n for n in names if n.startswith("stoker/benchmarks/")] == []


def test_the_public_surface_is_on_the_top_package():
    # lazily: `import stoker` loads no torch
    out = subprocess.run(
        [sys.executable, "-c", "import sys, stoker; print('torch' in sys.modules)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "False"
    from stoker.model.normalize import Normalize, with_normalize
    from stoker.pipeline.loader import Loader
    from stoker.tools.pack.api import merge_parts, pack
    from stoker.tools.verify.command import verify
    from stoker.tools.verify.indexing import index

    assert (stoker.Loader, stoker.Normalize, stoker.with_normalize) == (Loader, Normalize, with_normalize)
    assert (stoker.pack, stoker.merge_parts, stoker.verify, stoker.index) == (pack, merge_parts, verify, index)
    assert set(stoker.__all__) <= set(dir(stoker))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        stoker.nope  # noqa: B018


def test_every_error_is_a_stoker_error_named_error():
    import inspect

    from stoker import errors

    classes = [c for _, c in inspect.getmembers(errors, inspect.isclass) if c.__module__ == errors.__name__]
    assert len(classes) >= 15
    for c in classes:
        assert issubclass(c, errors.StokerError), c
        assert c.__name__.endswith("Error"), c
    # and no module of the package defines an exception of its own elsewhere, but for control
    # flow that never reaches a user (gpu-check's Skip, a producer stage's failure on its batch)
    internal = {"Skip", "StageFailure"}
    error_bases = {"Exception", "StokerError", "ValueError", "RuntimeError"}
    for path in _sources():
        if path.name == "errors.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = {getattr(b, "id", getattr(b, "attr", "")) for b in node.bases}
                assert not bases & error_bases or node.name in internal, (
                    f"{path}: class {node.name} belongs in stoker/errors.py"
                )


def _sources() -> list[Path]:
    """The package's .py files (the walk never enters .venv, build, tests, ...)."""
    out = []
    for folder, dirs, files in os.walk(ROOT):
        rel = Path(folder).relative_to(ROOT)
        dirs[:] = [d for d in dirs if not (rel == Path(".") and d in SKIP_DIRS) and not d.startswith((".", "__"))]
        out += [Path(folder) / f for f in files if f.endswith(".py")]
    return out


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(("stoker", *parts))


def _imports(path: Path, module: str, modules: set[str]) -> set[str]:
    """The stoker modules ``module`` imports, at module level, inside functions or under ``if
    TYPE_CHECKING:`` (a cycle a type checker alone reads is still a cycle of the design; a string
    annotation imports nothing)."""
    is_pkg = path.name == "__init__.py"
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_pkg else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = [target] + [f"{target}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            if name in modules and name != module:
                out.add(name)
    return out


def test_no_import_cycles():
    paths = {_module_name(p): p for p in _sources() if p.name != "__main__.py"}
    graph = {m: _imports(p, m, set(paths)) for m, p in paths.items()}
    # a package's __init__ re-exporting its own modules is not a cycle of the house
    for m in graph:
        graph[m] = {t for t in graph[m] if not (m.startswith(t + ".") and paths[t].name == "__init__.py")}
    cycles, state = [], {}

    def visit(m, stack):
        state[m] = 1
        stack.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                cycles.append(stack[stack.index(t) :] + [t])
            elif t not in state:
                visit(t, stack)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [])
    assert cycles == [], "import cycles (an import under `if TYPE_CHECKING:` counts too)"


@pytest.mark.parametrize("name, runner", [("bench-model", "model"), ("gpu-check", "gpu_check")])
def test_a_benchmark_command_without_the_benchmarks_says_where_it_runs(name, runner, monkeypatch, capsys):
    # as from the wheel: stoker.benchmarks is not there, the command is still listed
    from stoker.tools import cli

    monkeypatch.setitem(sys.modules, "stoker.benchmarks", None)
    for mod in [m for m in sys.modules if m.startswith("stoker.benchmarks.")]:
        monkeypatch.delitem(sys.modules, mod)
    assert cli.main([name, "--out", "x"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"stoker {name}: error: ") and err.count("\n") == 1
    assert f"python -m stoker.benchmarks.{runner}" in err
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert f"{name}" in capsys.readouterr().out


MAX_FUNCTION_LINES = 80  # a function's body, without its docstring: what a reader can hold


def _long_functions(path: Path) -> dict[str, int]:
    """``{"Class.function": lines}`` for the functions of ``path`` whose body, without its
    docstring, runs over :data:`MAX_FUNCTION_LINES` lines (nested functions count on their own
    and inside the one that holds them)."""
    out = {}

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                body = child.body
                if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                    body = body[1:]
                lines = body[-1].end_lineno - body[0].lineno + 1 if body else 0
                if lines > MAX_FUNCTION_LINES:
                    out[prefix + child.name] = lines
                walk(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                walk(child, f"{prefix}{child.name}.")
            else:
                walk(child, prefix)

    walk(ast.parse(path.read_text()), "")
    return out


def test_no_function_is_too_long_to_hold_in_mind():
    found = {}
    for path in _sources():
        rel = path.relative_to(ROOT)
        if rel.parts[0] in ("pipeline", "model", "tools"):
            found |= {f"{rel.as_posix()}:{name}": n for name, n in _long_functions(path).items()}
    assert found == {}, f"split these into named helpers (at most {MAX_FUNCTION_LINES} lines a function)"


def test_the_long_function_check_counts_the_body_without_its_docstring(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    doc = '    """A docstring\n    over lines."""\n'
    (tmp_path / "ok.py").write_text(f"def f():\n{doc}{body}\n")
    method = f"class C:\n    def g(self):\n    {doc}{body}\n        y = 1\n".replace("\n    x", "\n        x")
    (tmp_path / "long.py").write_text(method)
    assert _long_functions(tmp_path / "ok.py") == {}
    assert _long_functions(tmp_path / "long.py") == {"C.g": MAX_FUNCTION_LINES + 1}


def test_the_wheel_never_imports_the_benchmarks():
    modules = {_module_name(p) for p in _sources()}
    assert "stoker.benchmarks.model" in modules
    for path in _sources():
        module = _module_name(path)
        if not _is_benchmark(module):
            assert {m for m in _imports(path, module, modules) if _is_benchmark(m)} == set(), module


def test_the_version_lives_in_a_leaf_module():
    """One version number, in a module that imports nothing (pyproject reads it from there)."""
    import stoker.version

    tree = ast.parse((ROOT / "version.py").read_text())
    assert not [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    dynamic = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["dynamic"]
    assert dynamic["version"] == {"attr": "stoker.version.__version__"}
    assert stoker.__version__ == stoker.version.__version__


#: the most lines a module of the package holds (a longer one is two concerns)
MAX_MODULE_LINES = 600


def test_no_module_is_over_600_lines():
    long = {p.relative_to(ROOT).as_posix(): n for p in _sources() if (n := len(p.read_text().splitlines())) > 600}
    assert long == {}, f"split these by concern (at most {MAX_MODULE_LINES} lines a module)"


def test_no_test_module_is_over_600_lines():
    """The tests are held to the same rule: a longer test module is two themes (split it, the
    shared fixtures in a conftest.py, the shared helpers in a module both import)."""
    modules = sorted((ROOT / "tests").rglob("test_*.py"))
    assert len(modules) > 50 and ROOT / "tests" / "test_packaging.py" in modules
    long = {
        p.relative_to(ROOT).as_posix(): n for p in modules if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}, f"split these by theme (at most {MAX_MODULE_LINES} lines a test module)"
