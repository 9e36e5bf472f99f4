"""Serving a checkout for the benchmarks that compare one code with another.

A server is `thinktrans serve` (``python -m service.cli serve``) run from a checkout, with
that checkout on PYTHONPATH, so that an older commit's ``service`` package is the one
imported (``served_package`` says which file it was). On a machine of two cores or more the
server is pinned to ``SERVER_CPU`` and the load to ``LOAD_CPU``, so they do not take turns.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from http.client import HTTPConnection
from pathlib import Path
from typing import Any

SERVER_CPU, LOAD_CPU = 1, 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pin(pid: int, cpu: int) -> None:
    if len(os.sched_getaffinity(0)) >= 2:
        os.sched_setaffinity(pid, {cpu})


def served_package(checkout: Path) -> str:
    """The file of the ``service`` package that a server run from ``checkout`` imports."""
    out = subprocess.run([sys.executable, "-c", "import service; print(service.__file__)"],
                         cwd=checkout, env={**os.environ, "PYTHONPATH": str(checkout)},
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


def get(port: int, path: str, timeout: float = 30) -> tuple[int, str]:
    conn = HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read().decode(errors="replace")
    finally:
        conn.close()


def start_server(checkout: Path, port: int, env_extra: dict[str, str],
                 ready_s: float = 120) -> subprocess.Popen[bytes]:
    """Serve ``checkout`` (logs at warning) and wait until /readyz is 200."""
    env = {**os.environ, "PYTHONPATH": str(checkout), "THINKTRANS_LOG_LEVEL": "warning",
           **env_extra}
    proc = subprocess.Popen([sys.executable, "-m", "service.cli", "serve", "--port", str(port)],
                            cwd=checkout, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    pin(proc.pid, SERVER_CPU)
    deadline = time.monotonic() + ready_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
            raise SystemExit(f"server from {checkout} exited: {err[-2000:]}")
        try:
            if get(port, "/readyz", timeout=5)[0] == 200:
                return proc
        except OSError:
            pass
        time.sleep(0.25)
    proc.kill()
    raise SystemExit(f"server from {checkout} was not ready in {ready_s} s")


def stop(proc: subprocess.Popen[bytes], timeout_s: float = 30) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_status(pid: int, field: str) -> int | None:
    """A kB field of /proc/PID/status (VmRSS, VmHWM), in bytes; None once it has gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def side_by_side(results: dict[str, dict[str, Any]],
                 rows: Sequence[tuple[str, Callable[[dict[str, Any]], str]]]) -> str:
    """A markdown table: one column per checkout (``results``' keys), one row per label."""
    names = list(results)
    out = ["| | " + " | ".join(names) + " |", "| --- |" + " ---: |" * len(names)]
    for label, cell in rows:
        out.append(f"| {label} | " + " | ".join(cell(results[n]) for n in names) + " |")
    return "\n".join(out)
