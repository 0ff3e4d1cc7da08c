"""The job's shape from a SLURM allocation: `zerolaunch train recipe.yaml`, run once per node by `srun`.

Owns reading the `SLURM_*` variables and expanding a SLURM hostlist (`node[01-03,07],gpu-a`) the way
`scontrol show hostnames` does, without needing scontrol on the node. `apply_slurm` fills the launch values
that no flag gave (explicit flags win) and records where each value came from, for the table the CLI shows.
It does not start anything: launcher.py runs the job as for any other multi-node launch.

Under SLURM the node rank is known, so the rendezvous is `static` (node rank = SLURM_NODEID, node 0 hosts the
store on the first host of the nodelist) unless --rdzv-backend says otherwise.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping

from zerolaunch.launch.ports import LaunchError

DEFAULT_PORT = 29400
"""Rendezvous port on the first host when MASTER_PORT is not set (torchrun's customary c10d port)."""


def _split_top_level(text: str) -> list[str]:
    """Split at commas outside brackets: `a[1,3],b` -> ['a[1,3]', 'b']."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise LaunchError(f"SLURM nodelist {text!r}: ']' without '[' at position {i}")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise LaunchError(f"SLURM nodelist {text!r}: '[' without its ']'")
    parts.append(text[start:])
    return parts


def _expand_range_list(body: str, whole: str) -> list[str]:
    """`01-03,07` -> ['01', '02', '03', '07']: a range keeps the zero padding of its lower bound."""
    out = []
    for item in body.split(","):
        lo, sep, hi = item.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise LaunchError(
                f"SLURM nodelist {whole!r}: {item!r} inside [...] is not a number or a range like 01-04"
            )
        if not sep:
            out.append(lo)
            continue
        if int(hi) < int(lo):
            raise LaunchError(f"SLURM nodelist {whole!r}: range {item!r} runs backwards")
        width = len(lo)
        out += [str(n).zfill(width) for n in range(int(lo), int(hi) + 1)]
    return out


def expand_nodelist(nodelist: str) -> list[str]:
    """Host names of a SLURM hostlist, in order, as `scontrol show hostnames NODELIST` prints them.

    Each comma-separated entry may hold several bracket groups (`rack[1-2]-n[1-2]`); they expand as a
    product, the rightmost group varying fastest.
    """
    hosts: list[str] = []
    for entry in _split_top_level(nodelist.strip()):
        if not entry:
            raise LaunchError(f"SLURM nodelist {nodelist!r} has an empty entry (two commas in a row?)")
        expanded = [""]
        for literal, group in re.findall(r"([^\[]*)(?:\[([^\]]*)\])?", entry):
            options = _expand_range_list(group, nodelist) if group else [""]
            expanded = [prefix + literal + opt for prefix in expanded for opt in options]
        hosts += expanded
    return hosts


def _count_gpus(env: Mapping[str, str]) -> tuple[int, str] | None:
    """(GPUs on this node, the variable it came from), or None when the allocation does not say."""
    on_node = env.get("SLURM_GPUS_ON_NODE", "").strip()
    if on_node.isdigit() and int(on_node) > 0:
        return int(on_node), "SLURM_GPUS_ON_NODE"
    # --gpus-per-node=[type:]N, e.g. "4" or "h200:4"
    per_node = env.get("SLURM_GPUS_PER_NODE", "").strip().rsplit(":", 1)[-1]
    if per_node.isdigit() and int(per_node) > 0:
        return int(per_node), "SLURM_GPUS_PER_NODE"
    visible = env.get("CUDA_VISIBLE_DEVICES", "").strip()
    if visible and visible != "-1":
        return len([d for d in visible.split(",") if d.strip()]), "CUDA_VISIBLE_DEVICES"
    return None


def _int_var(env: Mapping[str, str], name: str) -> int:
    value = env.get(name, "").strip()
    if not value.isdigit():
        raise LaunchError(
            f"SLURM_JOB_ID is set but {name} is {value!r}, not a number; run zerolaunch under srun (one task "
            "per node), or pass --no-slurm and give --nnodes/--node-rank/--rdzv-endpoint yourself"
        )
    return int(value)


Origins = list[tuple[str, str, str]]
"""(launch value, shown value, where it came from) rows for the launch table."""


def apply_slurm(
    req, *, force: bool | None, nnodes_given: bool, backend_given: bool, env: Mapping[str, str] | None = None
):
    """`(request, origins)`: `req` with the values SLURM knows filled in where no flag set them.

    `force` is --slurm (True), --no-slurm (False) or neither (None: use SLURM when SLURM_JOB_ID is set).
    origins is None when SLURM is not used.
    """
    env = os.environ if env is None else env
    if force is False or (force is None and not env.get("SLURM_JOB_ID")):
        return req, None
    if not env.get("SLURM_JOB_ID"):
        raise LaunchError("--slurm was given but SLURM_JOB_ID is not set: this is not inside a SLURM job")
    job_id = env["SLURM_JOB_ID"]
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
    changes: dict = {}
    origins: Origins = []

    if nnodes_given:
        origins.append(("nnodes", str(req.nnodes), "--nnodes"))
    else:
        changes["nnodes"] = _int_var(env, "SLURM_NNODES")
        origins.append(("nnodes", str(changes["nnodes"]), "SLURM_NNODES"))
    nnodes = changes.get("nnodes", req.nnodes)
    tasks = env.get("SLURM_STEP_NUM_TASKS", "").strip()
    if tasks.isdigit() and int(tasks) > nnodes:
        raise LaunchError(
            f"this srun step runs {tasks} tasks on {nnodes} node(s), but zerolaunch starts all workers of a "
            "node itself: run it with one task per node (srun --ntasks-per-node=1)"
        )

    if req.node_rank is not None:
        origins.append(("node rank", str(req.node_rank), "--node-rank"))
    else:
        changes["node_rank"] = _int_var(env, "SLURM_NODEID")
        origins.append(("node rank", str(changes["node_rank"]), "SLURM_NODEID"))

    if req.cpu is not None:
        origins.append(("workers per node", f"{req.cpu} cpu", "--cpu"))
    elif req.gpus is not None:
        origins.append(("workers per node", f"{req.gpus} gpu", "--gpus"))
    else:
        counted = _count_gpus(env)
        if counted:
            changes["gpus"] = counted[0]
            origins.append(("workers per node", f"{counted[0]} gpu", counted[1]))
        else:
            origins.append(("workers per node", "all visible GPUs", "default (the allocation names none)"))

    if req.rdzv_endpoint is not None:
        origins.append(("rendezvous", req.rdzv_endpoint, "--rdzv-endpoint"))
    else:
        if not nodelist:
            raise LaunchError(
                "SLURM_JOB_NODELIST is not set, so node 0's address is unknown; pass --rdzv-endpoint HOST:PORT"
            )
        first = expand_nodelist(nodelist)[0]
        port_text = env.get("MASTER_PORT", "").strip()
        if port_text and not (port_text.isdigit() and 0 < int(port_text) < 65536):
            raise LaunchError(f"MASTER_PORT is {port_text!r}, not a port number (1-65535)")
        port = int(port_text) if port_text else DEFAULT_PORT
        changes["rdzv_endpoint"] = f"{first}:{port}"
        where = "first host of SLURM_JOB_NODELIST" + (", MASTER_PORT" if port_text else f", port {port}")
        origins.append(("rendezvous", changes["rdzv_endpoint"], where))

    if backend_given:
        origins.append(("rendezvous backend", req.rdzv_backend, "--rdzv-backend"))
    else:
        changes["rdzv_backend"] = "static"
        origins.append(("rendezvous backend", "static", "SLURM (node rank known)"))

    if req.run_id is not None:
        origins.append(("run id", req.run_id, "--run-id"))
    else:
        changes["run_id"] = job_id
        origins.append(("run id", job_id, "SLURM_JOB_ID"))
    return dataclasses.replace(req, **changes), origins


def render_origins(origins: Origins):
    from rich.table import Table

    table = Table(title="launch (SLURM job)", title_justify="left")
    table.add_column("launch")
    table.add_column("value")
    table.add_column("from")
    for name, value, where in origins:
        table.add_row(name, value, where)
    return table
