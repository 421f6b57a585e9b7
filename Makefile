# Quick start targets. `make demo` packs the built-in sample, and a labelled one that it also exports as a
# HALCON DLDataset, gives cached augmentation variants and previews; `make test` runs the test suite.
# `make test-fast` runs it without the tests marked slow (kills, interrupts, fuzzing, whole-script runs).
# `make test-min` runs the tests not marked slow against the lowest supported dependency versions, in a separate venv.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
DEMO ?= demo
MIN_VENV ?= .venv-min
MIN_CONSTRAINTS ?= .ci/constraints-min.txt
# Extra pytest arguments, e.g. PYTEST_ARGS="-k cli".
PYTEST_ARGS ?=
# Test processes (pytest-xdist): two keep both cores of a 2-core machine busy while one test waits on
# a subprocess; TEST_WORKERS=0 runs everything in one process.
TEST_WORKERS ?= 2

.PHONY: venv install demo test test-fast test-min lint bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

venv: $(PY)

install: $(PY)
	# torch is pinned first: it is a CPU build on local disk here, an unpinned one pulls GBs of CUDA.
	$(PY) -m pip install -q "torch==2.13.0"
	$(PY) -m pip install -q -e ".[test,torch,plot,s3,dask]"
	# Test-only: the parity tests compare with albumentations' last MIT release (they skip without it, as in
	# test-min, whose lowest OpenCV pin is older than albumentations 2.0.8 accepts).
	$(PY) -m pip install -q "albumentations==2.0.8"

demo: install
	rm -rf $(DEMO)
	$(PY) -m dlpack.sample $(DEMO)/raw --count 240 --size 1024
	$(VENV)/bin/dlpack build $(DEMO)/raw $(DEMO)/train.zarr --size 512x512
	$(VENV)/bin/dlpack build $(DEMO)/raw $(DEMO)/train.h5 --size 512x512 --quiet
	$(VENV)/bin/dlpack info $(DEMO)/train.zarr
	# Where the time goes: the scattered folder vs the packed stores, random order, warm cache.
	$(VENV)/bin/dlpack bench $(DEMO)/raw $(DEMO)/train.zarr $(DEMO)/train.h5 --order random --cache warm --seconds 2 --repeat 1 --step-ms 50 --plot $(DEMO)/bench.png
	# Labels: a small labelled sample (COCO boxes and polygons of the defects), packed with its boxes and
	# masks, then written out as a HALCON DLDataset (dataset.json, images/, to_hdict.py). Then the
	# augmentation cache: 4 variants of every image from a HALCON-style config (boxes and masks follow),
	# and a contact sheet of 6 originals and their variants to check by eye (demo/preview.png). A few seconds.
	$(PY) -m dlpack.sample $(DEMO)/labelled --count 48 --size 512 --labels
	$(VENV)/bin/dlpack build $(DEMO)/labelled/images $(DEMO)/labelled.zarr --labels coco:$(DEMO)/labelled/annotations.json --size 256x256
	$(VENV)/bin/dlpack export $(DEMO)/labelled.zarr --to dldataset $(DEMO)/labelled-halcon
	$(VENV)/bin/dlpack augment $(DEMO)/labelled.zarr --augment 4 --augment-config examples/augment_halcon.json
	$(VENV)/bin/dlpack preview $(DEMO)/labelled.zarr $(DEMO)/preview.png --count 6

# pytest exits 5 when it collected no tests; that is a failure here like any other non-zero status
# (a renamed folder or a bad -k must not pass CI silently).
test: install
	$(PY) -m pytest -q -n $(TEST_WORKERS) $(PYTEST_ARGS) || { rc=$$?; [ $$rc -ne 5 ] || echo "make: pytest ran no tests" >&2; exit $$rc; }

# The edit-and-rerun loop: the same suite less the tests marked `slow` (pyproject.toml, [tool.pytest.ini_options]),
# about a minute and a half on two cores. `make test` and CI still run everything.
test-fast: install
	$(PY) -m pytest -q -n $(TEST_WORKERS) -m "not slow" $(PYTEST_ARGS) || { rc=$$?; [ $$rc -ne 5 ] || echo "make: pytest ran no tests" >&2; exit $$rc; }

# A fresh venv with every core dependency at its declared lower bound (no torch or matplotlib:
# the tests that need them skip). The package is installed from this tree, as `make test` does.
# It runs the tests not marked slow: they make every call dlpack makes into NumPy, OpenCV, zarr,
# h5py and joblib (the backends' shared suite, decoding, transforms, builds with workers, the
# loader, exports). The slow ones kill and interrupt processes at each durable step, fuzz, and run
# the scripts: what they check is dlpack's journal, locks and publication on this OS, which the
# dependency versions do not change, and `make test` runs them. MIN_PYTEST_ARGS="" runs them all.
MIN_PYTEST_ARGS ?= -m "not slow"
test-min:
	rm -rf $(MIN_VENV)
	$(PYTHON) -m venv $(MIN_VENV)
	$(MIN_VENV)/bin/python -m pip install -q -c $(MIN_CONSTRAINTS) -e ".[test,plot]"
	$(MIN_VENV)/bin/python .ci/check_pins.py $(MIN_CONSTRAINTS)
	$(MIN_VENV)/bin/python -m pytest -q -n $(TEST_WORKERS) $(MIN_PYTEST_ARGS) $(PYTEST_ARGS) || { rc=$$?; [ $$rc -ne 5 ] || echo "make: pytest ran no tests" >&2; exit $$rc; }

lint: install
	$(VENV)/bin/ruff check dlpack tests benchmarks examples
	$(VENV)/bin/mypy

clean:
	rm -rf $(DEMO) $(MIN_VENV) .pytest_cache build *.egg-info
