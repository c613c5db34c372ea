# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
# Both create .venv when missing; re-running them is fast (a stamp file).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.stoker-installed
# torch/torchvision pinned within this machine's cap (a CUDA build that also runs on CPU).
TORCH  := torch==2.14.1 torchvision==0.29.1

.PHONY: demo test install clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile tools/install_pillow_simd.sh
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e '.[test,plot]'
	bash tools/install_pillow_simd.sh $(PY)
	@touch $@

demo: $(STAMP)
	$(VENV)/bin/stoker demo

test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) .pytest_cache *.egg-info
