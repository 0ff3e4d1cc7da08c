PY ?= python3
PIP ?= $(PY) -m pip
TORCH_VERSION ?= 2.13.0

.PHONY: install hf-old test lint demo bench clean

install:  ## CPU torch first (a plain `torch` requirement would pull a CUDA build), then the package
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install -q torch==$(TORCH_VERSION)
	DS_BUILD_OPS=0 $(PIP) install -q -e ".[dev,hf,parity]"

# transformers 4.57 beside the main environment, for tests/e2e/test_hf_families.py (folders written under 5.x
# must load in 4.x): --target keeps it out of site-packages, --no-deps takes numpy, safetensors, ... from the
# main environment; only a subprocess with .hf-old first on PYTHONPATH sees it. huggingface_hub 0.x imports
# requests (1.x moved to httpx), which the main environment need not have: it and its needs come too.
HF_OLD ?= .hf-old
hf-old:
	$(PY) -c "import sys; sys.path.insert(0, '$(HF_OLD)'); import transformers as t, huggingface_hub.hf_api; assert t.__version__.startswith('4.57.')" 2>/dev/null \
	  || $(PIP) install -q --no-deps --upgrade --target $(HF_OLD) "transformers==4.57.*" "tokenizers>=0.22,<0.23" "huggingface_hub>=0.34,<1.0" \
	     requests charset-normalizer idna urllib3 certifi

# one thread per process: several tests compare logits bit for bit with what their single-threaded ranks
# computed, and a run goes on past a failure (no -x) so that one failure does not hide the rest
test: install hf-old
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -p no:cacheprovider tests

lint:
	$(PY) -m ruff check zerolaunch tests bench
	$(PY) -m ruff format --check zerolaunch tests bench

demo: install  ## a second demo moves the first one aside (runs/demo/previous-<time>/) rather than mixing them
	$(PY) -m zerolaunch train recipes/tiny-gpt.yaml --cpu 2 --run-dir runs/demo --restart

bench:
	$(PY) bench/run.py

clean:
	rm -rf runs build *.egg-info .pytest_cache .hf-old
