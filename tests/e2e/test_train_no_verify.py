"""`zerolaunch train --no-verify`: resume reads a checkpoint whose crc32s do not match without checking them.

A checkpoint whose manifest records a wrong crc32 for one tensor (the file itself is intact, so its weights
train on; the manifest's own crc32 re-stamped, as a consistent but wrong manifest) is refused by `--resume` (exit 2, naming the file) and resumed from with `--no-verify`. Leaves out
the reader's checks themselves (tests/e2e/test_checkpoint_checksum.py).
"""

import json
import zlib

import pytest

pytestmark = pytest.mark.e2e


def test_resume_refuses_a_checksum_mismatch_and_no_verify_resumes(cli, tiny_recipe, tmp_path):
    run_dir = tmp_path / "run"
    first = cli.run(tiny_recipe(steps=2, every=2), "--cpu", "2", "--run-dir", run_dir, timeout=300)
    assert first.returncode == 0, (first.stdout + first.stderr)[-3000:]
    manifest_path = run_dir / "checkpoints" / "step_000002" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    tensors = manifest["ranks"][0]["checksums"]["tensors"]
    name = sorted(k for k in tensors if k.startswith("master/"))[0]
    tensors[name] ^= 1
    # re-stamp the manifest's own crc32 (canonical JSON of every other key), so the manifest reads as written
    # and the check that fires is the rank file's tensor crc
    body = {k: v for k, v in manifest.items() if k != "checksum"}
    manifest["checksum"]["body"] = zlib.crc32(
        json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    )
    manifest_path.write_text(json.dumps(manifest))

    refused = cli.run(
        tiny_recipe(steps=4, every=2), "--cpu", "2", "--run-dir", run_dir, "--resume", "auto", timeout=300
    )
    out = refused.stdout + refused.stderr
    assert refused.returncode == 2, out[-3000:]
    assert "rank_0.safetensors is damaged" in out and name in out and "--no-verify" in out, out[-3000:]

    resumed = cli.run(
        tiny_recipe(steps=4, every=2),
        "--cpu",
        "2",
        "--run-dir",
        run_dir,
        "--resume",
        "auto",
        "--no-verify",
        timeout=300,
    )
    out = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, out[-3000:]
    assert "resumed from" in out and "at step 2" in out, out[-3000:]
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [s for s in steps if isinstance(s, int)][-2:] == [3, 4], steps
