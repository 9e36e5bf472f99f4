"""Where a running server listens, and the liveness check that follows it.

A server may listen elsewhere than ``THINKTRANS_PORT`` (``serve --port P``, a config file),
so ``thinktrans serve`` records the address it really bound, and the image's
``HEALTHCHECK`` asks ``/healthz`` there (docs/deploy.md). Standard library only: a health
check runs every few seconds and must start fast.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

DEFAULT_PORT = 8088
# The file names one server: the last one this user started. Several servers per user
# (one per port) can each be checked with --url.
STATE_NAME = "serve.json"


def state_path() -> Path:
    """The per-user file a server writes its address to.

    ``$XDG_RUNTIME_DIR/thinktrans`` where set (a private tmpfs on systemd hosts), else
    ``~/.cache/thinktrans``: never a shared directory such as /tmp, where another user
    could plant the file.
    """
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = Path(runtime) if runtime else Path.home() / ".cache"
    return base / "thinktrans" / STATE_NAME


def local_url(host: str, port: int) -> str:
    """The URL a process on this machine reaches a server bound to ``host:port`` at."""
    host = host.strip("[]")
    try:
        addr = ipaddress.ip_address(host) if host else None
    except ValueError:
        return f"http://{host}:{port}"  # a name: it resolves here as it did for the bind
    if addr is None or addr.is_unspecified:
        host = "::1" if addr is not None and addr.version == 6 else "127.0.0.1"
        addr = ipaddress.ip_address(host)
    return f"http://[{addr}]:{port}" if addr.version == 6 else f"http://{addr}:{port}"


def write_state(host: str, port: int, path: Path | None = None) -> Path:
    """Record that this process serves on ``host:port`` (atomic: a reader sees all or none)."""
    path = path or state_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    data = {"url": local_url(host, port), "host": host, "port": port, "pid": os.getpid()}
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(data) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def clear_state(path: Path | None = None) -> None:
    """Remove the file if it still names this process (a later server may have replaced it)."""
    path = path or state_path()
    state = read_state(path)
    if state is not None and state.get("pid") == os.getpid():
        with contextlib.suppress(OSError):
            path.unlink()


def read_state(path: Path | None = None) -> dict[str, object] | None:
    """The recorded server, or None when there is none (or the file is unreadable)."""
    try:
        data = json.loads((path or state_path()).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("url"), str) else None


def target_url(path: Path | None = None) -> str:
    """Where to check: the running server's recorded address, else THINKTRANS_PORT's."""
    state = read_state(path)
    if state is not None:
        return str(state["url"])
    raw = os.environ.get("THINKTRANS_PORT", "").strip()
    port = int(raw) if raw.isdigit() else DEFAULT_PORT
    return local_url("127.0.0.1", port)


def check(url: str | None = None, timeout_s: float = 4.0,
          path: str = "/healthz") -> tuple[bool, str]:
    """GET ``path`` (``/healthz``, or ``/readyz``): (answered 200, one line saying what was
    asked and what came back)."""
    asked = f"{(url or target_url()).rstrip('/')}{path}"
    try:
        with urllib.request.urlopen(asked, timeout=timeout_s) as response:
            return response.status == 200, f"{asked}: {response.status}"
    except urllib.error.HTTPError as exc:
        return False, f"{asked}: {exc.code}"
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return False, f"{asked}: {reason}"


def wait(url: str | None, wait_s: float, path: str = "/healthz",
         pause_s: float = 0.25) -> tuple[bool, str]:
    """``check`` again every ``pause_s`` until it answers 200, ``wait_s`` at most: for a
    server just started in the background. Without ``url`` the address is looked up at each
    try, as the server records it only once it listens."""
    deadline = time.monotonic() + wait_s
    while True:
        healthy, line = check(url, path=path)
        if healthy or time.monotonic() + pause_s > deadline:
            return healthy, line
        time.sleep(pause_s)


def main(argv: list[str] | None = None) -> int:
    """``python3 -m service.tools.healthcheck [URL]``: exit 0 when healthy, 1 when not."""
    args = sys.argv[1:] if argv is None else argv
    healthy, line = check(args[0] if args else None)
    print(line, file=sys.stdout if healthy else sys.stderr)
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())
