"""`zerolaunch train RECIPE --hostfile hosts`: one launcher per host of a DeepSpeed hostfile, over `ssh`.

Owns the hostfile format and DeepSpeed's --include/--exclude filters (the same rules as DeepSpeed 0.19.8's
launcher/runner.py: `host slots=N` lines, `#` comments, `host1:0,1@host2`), the per-host command line, and
the supervision of the ssh processes: each host's output is streamed prefixed `[host] `, and when one host
fails (or on Ctrl-C) every other host is stopped. It does not train: each host runs the ordinary
`zerolaunch train ... --nnodes N --node-rank K` with a static rendezvous on the first host.

ssh is the system's client (no new dependency). The remote launcher is started with --stop-on-stdin-eof: a
killed local ssh closes the remote's stdin, and the remote launcher then stops its workers, so no host is
left training when the job is stopped here.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from zerolaunch.launch.ports import LaunchError, parse_endpoint

DEFAULT_PORT = 29400
"""Rendezvous port on the first host when neither --rdzv-endpoint nor MASTER_PORT says."""
FORWARDED_PREFIXES = ("NCCL_",)
FORWARDED_NAMES = ("PYTHONPATH",)
"""Variables sent to every host as DeepSpeed does (its EXPORT_ENVS + the CUDA accelerator's NCCL_)."""
SSH_OPTIONS = ["-o", "BatchMode=yes", "-o", "ConnectTimeout=15"]
"""Never prompt for a password (it would hang the job); fail fast on an unreachable host."""
STOP_GRACE_SECONDS = 30.0
"""How long a stopped host gets to stop its workers before its ssh is killed."""
_LINE = re.compile(r"^(\S+)\s+slots=(\d+)")


def parse_hostfile(path: str) -> OrderedDict[str, int]:
    """host -> slots, in file order (the order gives node ranks)."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as err:
        raise LaunchError(f"--hostfile {path}: cannot read it ({err.strerror})") from None
    pool: OrderedDict[str, int] = OrderedDict()
    for number, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _LINE.match(line)
        if not match:
            raise LaunchError(
                f"--hostfile {path}, line {number}: {line!r} is not 'HOST slots=N' (e.g. 'worker-0 slots=8')"
            )
        host, slots = match.group(1), int(match.group(2))
        if host in pool:
            raise LaunchError(f"--hostfile {path}, line {number}: host {host!r} is listed twice")
        if slots < 1:
            raise LaunchError(f"--hostfile {path}, line {number}: host {host!r} has slots=0; give N >= 1")
        pool[host] = slots
    if not pool:
        raise LaunchError(f"--hostfile {path} lists no host; write one 'HOST slots=N' line per node")
    return pool


def _parse_filter(text: str, flag: str) -> dict[str, list[int]]:
    """`host1:0,1@host2` -> {'host1': [0, 1], 'host2': []} ([] = the whole host)."""
    out: dict[str, list[int]] = {}
    for spec in text.split("@"):
        host, sep, slots = spec.partition(":")
        if not host:
            raise LaunchError(f"{flag} {text!r}: empty host name; the format is host1:0,1@host2")
        try:
            numbers = [int(s) for s in slots.split(",")] if sep else []
        except ValueError:
            raise LaunchError(
                f"{flag} {text!r}: slots of {host!r} must be numbers, e.g. {host}:0,1"
            ) from None
        out.setdefault(host, [])
        out[host] = sorted(set(out[host] + numbers))
    return out


def filter_hosts(pool: dict[str, int], include: str = "", exclude: str = "") -> OrderedDict[str, list[int]]:
    """host -> slot indices to use, as DeepSpeed's parse_inclusion_exclusion (hostfile order kept)."""
    if include and exclude:
        raise LaunchError("--include and --exclude cannot be used together (as in DeepSpeed); give one")
    active = {host: list(range(slots)) for host, slots in pool.items()}
    text, flag = (include, "--include") if include else (exclude, "--exclude")
    if not text:
        return OrderedDict(active)
    chosen: dict[str, list[int]] = {} if include else {h: list(s) for h, s in active.items()}
    for host, slots in _parse_filter(text, flag).items():
        if host not in active:
            raise LaunchError(f"{flag}: host {host!r} is not in the hostfile (hosts: {', '.join(active)})")
        for slot in slots:
            if slot not in active[host]:
                raise LaunchError(
                    f"{flag}: host {host!r} has no slot {slot} (it has slots 0..{len(active[host]) - 1})"
                )
        if include:
            chosen[host] = slots or active[host]
        else:
            chosen[host] = [s for s in chosen[host] if s not in slots] if slots else []
    result = OrderedDict((h, chosen[h]) for h in active if chosen.get(h))
    if not result:
        raise LaunchError(f"{flag} {text!r} leaves no host to run on")
    return result


def workers_per_host(hosts: dict[str, list[int]], gpus: int | None, cpu: int | None) -> int:
    """The one worker count every host runs; a host whose slots disagree is an error naming it."""
    wanted, flag = (gpus, "--gpus") if gpus is not None else (cpu, "--cpu")
    first_host, first_slots = next(iter(hosts.items()))
    expected = wanted if wanted is not None else len(first_slots)
    for host, slots in hosts.items():
        if len(slots) != expected:
            why = f"{flag} {wanted}" if wanted is not None else f"{first_host}'s {expected}"
            raise LaunchError(
                f"host {host!r} has {len(slots)} slot(s) in use but {why} asks for {expected} worker(s) per "
                "host; every host runs the same number of workers: fix its slots= or --include/--exclude"
            )
    return expected


def exported_env(names: list[str], env: dict[str, str]) -> dict[str, str]:
    """The variables sent to every host: --export NAME (or NAME=VALUE), NCCL_*, PYTHONPATH."""
    out = {k: v for k, v in env.items() if k.startswith(FORWARDED_PREFIXES) or k in FORWARDED_NAMES}
    for name in names:
        key, sep, value = name.partition("=")
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise LaunchError(f"--export {name!r}: {key!r} is not a variable name")
        if not sep:
            if key not in env:
                raise LaunchError(
                    f"--export {key}: {key} is not set here; set it, or give --export {key}=VALUE"
                )
            value = env[key]
        out[key] = value
    return out


def _child_args(req, workers: int, device: str) -> list[str]:
    """The `zerolaunch train` flags every host gets besides its node rank (the request's other options)."""
    args = [req.recipe, f"--{'cpu' if device == 'cpu' else 'gpus'}", str(workers)]
    for item in req.sets:
        args += ["--set", item]
    if req.run_dir:
        args += ["--run-dir", req.run_dir]
    if req.resume:
        args += ["--resume", req.resume]
    if req.restart:
        args.append("--restart")
    if not req.verify:
        args.append("--no-verify")
    args += ["--max-restarts", str(req.max_restarts), "--timeout", str(req.timeout_seconds)]
    if req.all_ranks:
        args.append("--all-ranks")
    return args


def remote_command(
    req,
    *,
    node_rank: int,
    nnodes: int,
    endpoint: str,
    run_id: str,
    workers: int,
    device: str,
    visible_devices: list[int] | None,
    env: dict[str, str],
    cwd: str,
) -> str:
    """The shell command ssh runs on one host: cd to this directory, set the variables, start the launcher.

    visible_devices: the GPUs --include/--exclude left on this host, when not all of them (as DeepSpeed,
    through CUDA_VISIBLE_DEVICES).
    """
    env = dict(env)
    if visible_devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, visible_devices))
    argv = [sys.executable, "-m", "zerolaunch", "train", *_child_args(req, workers, device)]
    argv += ["--nnodes", str(nnodes), "--node-rank", str(node_rank), "--rdzv-endpoint", endpoint]
    argv += ["--rdzv-backend", "static", "--run-id", run_id, "--no-slurm", "--stop-on-stdin-eof"]
    assigns = [f"{k}={shlex.quote(v)}" for k, v in sorted(env.items())]
    return f"cd {shlex.quote(cwd)} && exec env {' '.join(assigns)} {shlex.join(argv)}"


def check_reachable(ssh: str, hosts: list[str]) -> None:
    """`ssh HOST true` on every host at once; the unreachable ones are one error naming them."""

    def probe(host: str) -> tuple[str, int, str]:
        try:
            done = subprocess.run(
                [ssh, *SSH_OPTIONS, host, "true"],
                capture_output=True,
                text=True,
                timeout=60,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            return host, -1, "no answer within 60 s"
        return host, done.returncode, (done.stderr.strip().splitlines() or [""])[-1]

    with ThreadPoolExecutor(max_workers=min(16, len(hosts))) as pool:
        bad = [r for r in pool.map(probe, hosts) if r[1] != 0]
    if bad:
        detail = "; ".join(f"{h}: {msg or f'ssh exit {code}'}" for h, code, msg in bad)
        raise LaunchError(
            f"cannot reach host(s) {', '.join(h for h, _, _ in bad)} over ssh ({detail}). Every host needs "
            "passwordless ssh from here (try `ssh HOST true`) and the same Python environment and directory"
        )


def _stream(host: str, pipe, lock: threading.Lock) -> None:
    for line in iter(pipe.readline, ""):
        with lock:
            sys.stdout.write(f"[{host}] {line}" if line.endswith("\n") else f"[{host}] {line}\n")
            sys.stdout.flush()
    pipe.close()


def _stop(procs: dict[str, subprocess.Popen]) -> None:
    for proc in procs.values():
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    for proc in procs.values():
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class _Interrupted(Exception):
    """SIGINT or SIGTERM reached the launcher of a hostfile job (raised by _on_stop_signal)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _on_stop_signal(signum, frame) -> None:
    raise _Interrupted(signum)


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
"""What stops every host. Handled explicitly, not left to Python's KeyboardInterrupt: a process started with
SIGINT ignored (a background job of a non-interactive shell, nohup) never gets KeyboardInterrupt, and without
a handler SIGTERM (a scheduler's, `kill`) would end this process and leave every host training. The
single-node launcher gets the same from torch elastic's agent, which installs its own handlers."""


def launch_hosts(req, *, hostfile: str, include: str, exclude: str, exports: list[str], console) -> int:
    """Run the job on every host of the hostfile; the exit code of the first host that failed, else 0."""
    ssh = shutil.which("ssh")
    if ssh is None:
        raise LaunchError("--hostfile needs the `ssh` client, and none is on PATH; install openssh-client")
    if req.nnodes != 1 or req.node_rank is not None:
        raise LaunchError("--hostfile decides --nnodes and --node-rank itself (one node per host); drop them")
    pool = parse_hostfile(hostfile)
    hosts = filter_hosts(pool, include, exclude)
    workers = workers_per_host(hosts, req.gpus, req.cpu)
    device = "cpu" if req.cpu is not None else "cuda"
    env = exported_env(exports, dict(os.environ))
    first = next(iter(hosts))
    if req.rdzv_endpoint:
        host, port = parse_endpoint(req.rdzv_endpoint)
        endpoint = f"{host}:{port}"
    else:
        port_text = os.environ.get("MASTER_PORT", "").strip()
        if port_text and not (port_text.isdigit() and 0 < int(port_text) < 65536):
            raise LaunchError(f"MASTER_PORT is {port_text!r}, not a port number (1-65535)")
        endpoint = f"{first}:{port_text or DEFAULT_PORT}"
    run_id = req.run_id or uuid.uuid4().hex[:12]
    check_reachable(ssh, list(hosts))
    console.print(
        f"launching on {len(hosts)} host(s) over ssh ({', '.join(hosts)}), {workers} {device} worker(s) each; "
        f"rendezvous {endpoint} (static), run id {run_id}; forwarding {', '.join(sorted(env)) or 'no variables'}",
        markup=False,
        highlight=False,
    )
    cwd = os.getcwd()
    lock = threading.Lock()
    procs: dict[str, subprocess.Popen] = {}
    threads = []
    previous = {s: signal.signal(s, _on_stop_signal) for s in STOP_SIGNALS}
    try:
        for rank, (host, slots) in enumerate(hosts.items()):
            command = remote_command(
                req,
                node_rank=rank,
                nnodes=len(hosts),
                endpoint=endpoint,
                run_id=run_id,
                workers=workers,
                device=device,
                env=env,
                cwd=cwd,
                visible_devices=None if device == "cpu" or slots == list(range(pool[host])) else slots,
            )
            proc = subprocess.Popen(
                [ssh, *SSH_OPTIONS, host, command],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                errors="replace",
            )
            procs[host] = proc
            thread = threading.Thread(target=_stream, args=(host, proc.stdout, lock), daemon=True)
            thread.start()
            threads.append(thread)
        while True:
            failed = [(h, p.returncode) for h, p in procs.items() if p.poll() not in (None, 0)]
            if failed:
                host, code = failed[0]
                _stop(procs)
                for thread in threads:
                    thread.join(timeout=5)
                why = "unreachable over ssh" if code == 255 else f"exit code {code}"
                console.print(f"host {host} failed ({why}); stopped every other host", highlight=False)
                return code if code > 0 else 128 - code  # killed by a signal: as a shell reports it
            if all(p.poll() == 0 for p in procs.values()):
                for thread in threads:
                    thread.join(timeout=5)
                return 0
            time.sleep(0.2)
    except _Interrupted as err:
        signum = err.signum
        for s in STOP_SIGNALS:  # a second Ctrl-C while the hosts stop must not cut the stop short
            signal.signal(s, signal.SIG_IGN)
        _stop(procs)
        how = "interrupted" if signum == signal.SIGINT else f"interrupted by {signal.Signals(signum).name}"
        console.print(f"{how}: stopped every host", highlight=False)
        return 128 + signum
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def stop_when_stdin_closes() -> None:
    """In a launcher started by --hostfile: SIGTERM ourselves when ssh's channel (our stdin) closes."""

    def watch() -> None:
        # os.read on the raw fd: a daemon thread blocked in sys.stdin's buffered reader aborts the
        # interpreter at exit (it holds the reader's lock)
        while os.read(0, 4096):
            pass
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, daemon=True, name="stdin-eof").start()
