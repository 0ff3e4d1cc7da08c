"""The streams of collectives are comm.py's alone ([Note: comm streams] in zerolaunch/zero/comm.py).

Tests: no module of zerolaunch/zero other than comm.py calls `wait_stream` or issues / awaits a collective
inside `with torch.cuda.stream(...)` (read with ast: a `comm.` call, a `.wait()`, or a call of a function of
the same module that makes a `comm.` call); the checker flags the patterns the callers used before the
streams moved into comm.py; the list forms of reduce_scatter / all_gather and `Pending.wait(then=...)` on
one rank without streams. Leaves out: the stream waits themselves (CUDA only: tests/dist/test_zero12_cuda.py
and test_zero3_cuda.py on the GPU).
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import torch

import zerolaunch.zero
from zerolaunch.zero import comm

ZERO = Path(zerolaunch.zero.__file__).parent


def _is_cuda_stream_call(node: ast.AST) -> bool:
    """`torch.cuda.stream(...)` (or `cuda.stream(...)`) anywhere in an expression (also inside `a if c else b`)."""
    return any(
        isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr == "stream"
        and isinstance(n.func.value, ast.Attribute | ast.Name)
        and (n.func.value.attr if isinstance(n.func.value, ast.Attribute) else n.func.value.id) == "cuda"
        for n in ast.walk(node)
    )


def _is_comm_call(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "comm"
    )


def _called_name(node: ast.Call) -> str | None:
    if isinstance(node.func, ast.Name):
        return node.func.id
    if isinstance(node.func, ast.Attribute):
        return node.func.attr
    return None


def stream_violations(source: str, where: str) -> list[str]:
    tree = ast.parse(source)
    issuing = {
        f.name
        for f in ast.walk(tree)
        if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
        and any(_is_comm_call(n) for n in ast.walk(f))
    }
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _called_name(node) == "wait_stream":
            found.append((node.lineno, "wait_stream outside comm.py"))
        if isinstance(node, ast.With) and any(_is_cuda_stream_call(item.context_expr) for item in node.items):
            for stmt in node.body:
                for n in ast.walk(stmt):
                    if not isinstance(n, ast.Call):
                        continue
                    name = _called_name(n)
                    if _is_comm_call(n) or name == "wait" or name in issuing:
                        found.append((n.lineno, f"{name}() under torch.cuda.stream"))
    return [f"{where}:{line}: {what}" for line, what in sorted(found)]


def test_no_module_but_comm_handles_the_streams_of_collectives():
    found = []
    for path in sorted(ZERO.rglob("*.py")):
        if path == ZERO / "comm.py":
            continue
        found += stream_violations(path.read_text(), str(path.relative_to(ZERO)))
    assert found == []


def test_the_checker_flags_the_callers_old_stream_handling():
    old_reducer = """
        def _issue(self, bucket):
            if self.stream is not None:
                self.stream.wait_stream(torch.cuda.current_stream(self.device))
                with torch.cuda.stream(self.stream):
                    pending = comm.reduce_scatter(out, src, self.group, async_op=True)

        def _complete_oldest(self):
            with torch.cuda.stream(self.stream):
                pending.wait()
                self._accumulate(bucket, out)
    """
    old_unit = """
        def gather(self, group, *, stream):
            with torch.cuda.stream(stream):
                self._issue_gather(group)

        def _issue_gather(self, group):
            comm.all_gather(full, src, group, async_op=True)

        def issue_reduce(self, group, *, stream):
            with torch.cuda.stream(stream) if stream is not None else nullcontext():
                comm.reduce_scatter(out, staging, group, async_op=True)
    """
    assert [v.split(": ", 1)[1] for v in stream_violations(textwrap.dedent(old_reducer), "r")] == [
        "wait_stream outside comm.py",
        "reduce_scatter() under torch.cuda.stream",
        "wait() under torch.cuda.stream",
    ]
    assert len(stream_violations(textwrap.dedent(old_unit), "u")) == 2
    copies_only = """
        with torch.cuda.device(self.device), torch.cuda.stream(self.copy_stream):
            self.copy_stream.wait_event(start)
            step_fn(self)
    """
    assert stream_violations(textwrap.dedent(copies_only), "c") == []


def test_list_forms_and_then_on_one_rank():
    staging = torch.arange(6.0)
    out = torch.empty(6)
    pending = comm.reduce_scatter(out, [staging[:4], staging[4:]], None, async_op=True, average=True)
    order = []
    pending.wait(then=lambda: order.append(out.clone()))
    pending.wait(then=lambda: order.append("again"))  # a second wait does nothing
    assert torch.equal(out, staging) and len(order) == 1 and torch.equal(order[0], staging)
    full = [torch.empty(2), torch.empty(3)]
    assert comm.all_gather(full, torch.arange(5.0), None) is None
    assert torch.equal(torch.cat(full), torch.arange(5.0))
