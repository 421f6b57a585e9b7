# Quick start targets. `make demo` packs the built-in sample; `make test` runs the test suite.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
DEMO ?= demo

.PHONY: venv install demo test lint bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

venv: $(PY)

install: $(PY)
	# torch is pinned first: it is a CPU build on local disk here, an unpinned one pulls GBs of CUDA.
	$(PY) -m pip install -q "torch==2.13.0"
	$(PY) -m pip install -q -e ".[test,torch,plot]"

demo: install
	rm -rf $(DEMO)
	$(PY) -m dlpack.sample $(DEMO)/raw --count 240 --size 1024
	$(VENV)/bin/dlpack build $(DEMO)/raw $(DEMO)/train.zarr --size 512x512
	$(VENV)/bin/dlpack build $(DEMO)/raw $(DEMO)/train.h5 --size 512x512 --quiet
	$(VENV)/bin/dlpack info $(DEMO)/train.zarr
	# Where the time goes: the scattered folder vs the packed stores, random order, warm cache.
	$(VENV)/bin/dlpack bench $(DEMO)/raw $(DEMO)/train.zarr $(DEMO)/train.h5 --order random --cache warm --seconds 2 --repeat 1 --step-ms 50

test: install
	$(PY) -m pytest -q

lint: install
	$(VENV)/bin/ruff check dlpack tests benchmarks examples
	$(VENV)/bin/mypy

clean:
	rm -rf $(DEMO) .pytest_cache build *.egg-info
