"""bench/hf_pretrained_memory.py's smoke mode: `--tiny` saves a small Llama, runs the zerolaunch Trainer at stage
3 on 2 gloo ranks with the model built on meta and with plain from_pretrained, and prints the memory table.

Covers: both ways' ranks start, build the engine, train and report; each row's model size is the saved model's
(the meta model's shapes and dtypes are the real ones); the table's columns and that the high-water marks only
grow along the run. Leaves out: any comparison of the two ways' memory. At this size the difference is not
reliable: transformers' from_pretrained maps the safetensors file, so its RSS after the load is within a few MB
of the meta way's (measured: +5 MB for a 65 MB model), and the later gaps are of the order of the noise.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers", minversion="5.17")  # the Trainer hooks zerolaunch.hf replaces

ROOT = Path(__file__).resolve().parents[2]
ROW = re.compile(r"(meta|plain)\s+([01])" + r"\s+([\d.]+)" * 10 + r"$")


def _bench():
    spec = importlib.util.spec_from_file_location(
        "hf_pretrained_memory", ROOT / "bench" / "hf_pretrained_memory.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tiny_table_has_both_ways_on_both_ranks():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "hf_pretrained_memory.py"), "--tiny", "--timeout", "300"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=400,
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    rows = {}
    for line in proc.stdout.splitlines():
        m = ROW.match(line.strip())
        if m:
            rows[(m.group(1), int(m.group(2)))] = [float(x) for x in m.groups()[2:]]
    assert set(rows) == {("meta", 0), ("meta", 1), ("plain", 0), ("plain", 1)}, proc.stdout

    bench = _bench()
    model = bench.llama(tiny=True)
    expected_gib = bench.model_bytes(model) / 2**30
    for key, cells in rows.items():
        (
            size,
            base,
            after_model,
            model_anon,
            after_engine,
            engine_anon,
            engine_hwm,
            engine_anonmax,
            peak,
            anonmax,
        ) = cells
        assert size == pytest.approx(expected_gib, abs=1e-3), key
        assert 0 < model_anon <= after_model, key
        assert 0 < engine_anon <= after_engine <= engine_hwm <= peak, key
        assert base <= engine_hwm, key
        # the sampled RssAnon maxima: at least the values read at the points, at most the RSS they are part of
        assert model_anon <= engine_anonmax <= anonmax <= peak, key
        assert engine_anon <= engine_anonmax <= engine_hwm, key
