#!/usr/bin/env bash
# What a user installs, checked as a user installs it: build the sdist and, from it, the wheel;
# install the wheel into a virtual environment outside the checkout; and from a folder outside
# the repository run `stoker --version`, `python -m stoker`, import every module, pack a few
# generated images and load one epoch. A module or data file left out of the wheel fails here.
# `make test` runs it after the test suite (`make wheel-check` alone).
#
# The environment's dependencies stay between runs (build/wheel-venv; `make clean` removes it);
# stoker itself is reinstalled from the new wheel every time.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-.venv/bin/python}
VENV=build/wheel-venv
DIST=build/dist

rm -rf "$DIST"
mkdir -p build
# Built from a copy of the checkout's files (tracked, and untracked but not ignored): setuptools
# rewrites stoker.egg-info where it builds, and `make test` runs this beside the suite, whose
# processes read that folder's metadata (a checkout that is no git work tree builds in place).
SRC=.
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    SRC=build/wheel-src
    rm -rf "$SRC" && mkdir -p "$SRC"
    git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do
        [ -e "$f" ] && printf '%s\0' "$f"
    done | xargs -0 cp --parents -t "$SRC"
fi
"$PY" -m build --sdist --wheel --outdir "$DIST" "$SRC" >build/wheel-build.log 2>&1 \
    || { tail -20 build/wheel-build.log; echo "wheel-check: building the sdist/wheel failed"; exit 1; }
wheel=$(ls "$DIST"/stoker-*.whl)
sdist=$(ls "$DIST"/stoker-*.tar.gz)
echo "wheel-check: built $(basename "$sdist") and $(basename "$wheel") (the wheel from the sdist)"

# torch, torchvision, triton and the nvidia-* libraries (DALI among them) are ~7 GB: a second copy
# filled a CI machine's disk. The check's environment sees the test environment's copies through
# one .pth path of links to those distributions alone; every other dependency the wheel names is
# resolved and installed fresh, so a dependency missing from pyproject.toml still fails here.
SHARED=build/wheel-shared
rm -rf "$SHARED" && mkdir -p "$SHARED"
"$PY" - "$SHARED" <<'PY'
import importlib.metadata as md, pathlib, re, sys
out = pathlib.Path(sys.argv[1]).resolve()
heavy = re.compile(r"(torch|torchvision|triton|nvidia-.*|cuda-.*)")
for dist in md.distributions():
    if not heavy.fullmatch(re.sub(r"[-_.]+", "-", dist.metadata["Name"]).lower()):
        continue
    site = pathlib.Path(dist.locate_file("")).resolve()
    for top in {pathlib.PurePath(f).parts[0] for f in dist.files or ()} - {".."}:
        if (site / top).exists() and not (out / top).exists():
            (out / top).symlink_to(site / top)
PY
purelib() { "$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }
pth=stoker-wheel-check-shared.pth
if [ -x "$VENV/bin/python" ] && [ ! -f "$(purelib)/$pth" ]; then
    rm -rf "$VENV"  # made before the environments shared the heavy libraries: its own copies go
fi
test -x "$VENV/bin/python" || "$PY" -m venv "$VENV"
(cd "$SHARED" && pwd) >"$(purelib)/$pth"
"$VENV/bin/python" -m pip install -q --upgrade pip
# the wheel's own dependency list, with this machine's pins
"$VENV/bin/python" -m pip install -q -c constraints.txt "$wheel"
"$VENV/bin/python" -m pip install -q --force-reinstall --no-deps "$wheel"
"$VENV/bin/python" -m pip check
# the research benchmarks run from a checkout: the wheel leaves benchmarks/ out
"$VENV/bin/python" - "$wheel" <<'PY'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
left = [n for n in names if n.startswith("stoker/benchmarks/")]
assert not left, f"the wheel carries the research benchmarks: {left[:3]}"
PY

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
venv=$(cd "$VENV" && pwd)
(
    cd "$work"
    "$venv/bin/stoker" --version
    "$venv/bin/python" -m stoker --version
    "$venv/bin/python" - <<'PY'
import importlib, pathlib, pkgutil, sys
import stoker
where = pathlib.Path(stoker.__file__).resolve()
assert "site-packages" in where.parts, f"stoker imported from {where}, not the installed wheel"
assert (where.parent / "py.typed").exists(), "py.typed is missing from the wheel"
names = [m.name for m in pkgutil.walk_packages(stoker.__path__, "stoker.")]
extras = []
for name in names:
    try:
        importlib.import_module(name)
    except stoker.MissingExtraError as e:  # an integration whose pip extra is not installed: one line
        extras.append(f"{name} ({str(e).split(': pip install ')[-1].split()[0]})")
print(f"imported {len(names) - len(extras)} modules of stoker {stoker.__version__} from {where.parent}; "
      f"without their extra: {', '.join(extras) or 'none'}")
from stoker.tools.common.synth import make_image_folder
make_image_folder(pathlib.Path("images"), per_class=4, seed=0)
PY
    "$venv/bin/stoker" pack images shards --val-fraction 0.25 -q --workers 2
    # a benchmark's command, from the wheel: one line saying where it runs, exit 2
    rc=0; "$venv/bin/stoker" bench-model 2>bench-model.err || rc=$?
    test "$rc" = 2 && grep -q "checkout" bench-model.err || { cat bench-model.err; exit 1; }
    "$venv/bin/python" - <<'PY'
import stoker
for backend in ("pil", "auto"):
    with stoker.Loader("shards/train", batch_size=4, crop=32, backend=backend, threads=1) as loader:
        n = sum(len(y) for _, y in loader)
        assert n == len(loader) * 4, (n, len(loader))
        print(f"one epoch of the Loader ({loader.backend}): {n} samples in {len(loader)} batches")
PY
)
echo "wheel-check: ok"
