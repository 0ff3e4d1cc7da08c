PY ?= python3
PIP ?= $(PY) -m pip
TORCH_VERSION ?= 2.13.0

.PHONY: install test lint demo bench clean

install:  ## CPU torch first (a plain `torch` requirement would pull a CUDA build), then the package
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install -q torch==$(TORCH_VERSION)
	DS_BUILD_OPS=0 $(PIP) install -q -e ".[dev,hf,parity]"

test: install
	$(PY) -m pytest -q -x -p no:cacheprovider tests

lint:
	$(PY) -m ruff check zerolaunch tests bench
	$(PY) -m ruff format --check zerolaunch tests bench

demo: install  ## a second demo moves the first one aside (runs/demo/previous-<time>/) rather than mixing them
	$(PY) -m zerolaunch train recipes/tiny-gpt.yaml --cpu 2 --run-dir runs/demo --restart

bench:
	$(PY) bench/run.py

clean:
	rm -rf runs build *.egg-info .pytest_cache
