# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
# Both create .venv when missing; re-running them is fast (a stamp file).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.stoker-installed
# This machine's pins (its pip caps torch at 2.14.1, torchvision at 0.29.1): constraints.txt,
# not bounds in pyproject.toml.
PIP    := $(PY) -m pip install -q -c constraints.txt

.PHONY: demo test lint docs wheel-check install clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile constraints.txt tools/install_pillow_simd.sh
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PIP) torch torchvision
	$(PIP) -e '.[test,plot,tensorboard,detect,bench]'
	bash tools/install_pillow_simd.sh $(PY)
	@touch $@

demo: $(STAMP)
	$(VENV)/bin/stoker demo

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# The site (mkdocs.yml) into build/site; a broken link or a stale `:::` reference fails it.
# `python -m mkdocs`, not .venv/bin/mkdocs: the script's folder would come first on sys.path, and
# griffe would take the `stoker` console script there for the package.
docs: $(STAMP)
	$(PY) -m mkdocs build --strict -q

# Lint, then the suite in TEST_JOBS processes (pytest-xdist, a test file to each) with the site and
# the wheel check beside it (tests/run_checks.sh). Three on 2 cores: the suite's tests wait on
# processes and servers about a third of the time (the suite alone 7:46 against 8:26 for two, side by
# side; a clean clone's make test 524 s against 525-548 s, 2026-12-07).
TEST_JOBS ?= 3

test: $(STAMP)
	bash tests/run_checks.sh $(PY) $(TEST_JOBS)

wheel-check: $(STAMP)
	bash tests/wheel_check.sh $(PY)

clean:
	rm -rf $(VENV) .pytest_cache *.egg-info build
