#!/usr/bin/env bash
# Wheels for a GPU machine that cannot reach a package index: DeepSpeed 0.19.8 (built here without its C++/CUDA
# ops, DS_BUILD_OPS=0; it JIT-builds cpu_adam there when ds-z2-off runs) and what it imports that the device
# image lacks. Into .whl/ (git-ignored); carry it with the call and install it first:
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
#   export PYTHONPATH=$PWD:/tmp/site
# The image has torch, numpy, packaging, psutil and tqdm. pydantic was missing on 2026-12-05 (ds rows failed
# with "No module named 'pydantic'"), so it and its own needs come too. Python 3.12 on x86-64 there.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
DS_BUILD_OPS=0 python3 -m pip wheel -q --no-deps --no-build-isolation deepspeed==0.19.8 -w .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 -d .whl \
  hjson==3.1.0 py-cpuinfo==9.0.0 msgpack==1.2.4 einops==0.8.2 ninja==1.13.2 \
  pydantic==2.13.4 pydantic-core==2.46.4 annotated-types==0.7.0 typing-inspection==0.4.2 typing-extensions==4.16.0
ls .whl
