"""The README's blocks that start a server and talk to it, run as pasted, in bash."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import free_port

ROOT = Path(__file__).resolve().parent.parent
# Long enough for a hang to fail a test, never what it measures.
HANG_S = 180.0

pytestmark = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("curl") is None,
                                reason="the README's blocks need bash and curl")


def readme_block(heading: str, contains: str) -> str:
    """The first ```sh block under ``heading`` (up to the next heading) holding ``contains``."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split(f"\n{heading}\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```sh\n(.*?)^```$", section, re.M | re.S)
    return next(block for block in blocks if contains in block)


def run_block(block: str, tmp_path: Path) -> tuple[int, str]:
    """Run ``block`` with bash in ``tmp_path``, where ``.venv`` is this test's environment and
    ``examples`` the checkout's, on a free port instead of 8088; stop what it left running.
    The exit status and what it printed on stdout."""
    port = free_port()
    script = block.replace("localhost:8088", f"localhost:{port}").replace(
        "127.0.0.1:8088", f"127.0.0.1:{port}")
    assert script != block, "the block no longer talks to 127.0.0.1:8088"
    (tmp_path / ".venv").symlink_to(sys.prefix)
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    env = {name: value for name, value in os.environ.items()
           if not name.startswith("THINKTRANS_")}
    env.update(THINKTRANS_PORT=str(port), XDG_RUNTIME_DIR=str(tmp_path),
               PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "client"), *sys.path]))
    # Files, not pipes: the server the block leaves in the background holds them open.
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.Popen(["bash", "-c", script], cwd=tmp_path, env=env, stdout=stdout,
                                stderr=stderr, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        code = proc.wait(timeout=HANG_S)
    finally:
        _stop_group(proc.pid)
    return code, out.read_text(encoding="utf-8")


def _stop_group(pgid: int) -> None:
    """SIGTERM to the block's process group (the server it started), then wait for it to go."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    for _ in range(int(HANG_S * 10)):
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.killpg(pgid, signal.SIGKILL)


def test_the_try_it_block_prints_the_translation(tmp_path: Path) -> None:
    """Pasted as it stands: the server starts in the background, and the request waits for
    it (curl at once had found nothing listening: exit 7, nothing printed)."""
    block = readme_block("## Try it", "serve &")
    [payload] = re.findall(r"-d '(\{.*?\})'", block, re.S)
    [text] = json.loads(payload)["texts"]
    code, stdout = run_block(block, tmp_path)
    assert code == 0, stdout
    answer = json.loads(stdout.strip().splitlines()[-1])
    [result] = answer["results"]
    statuses = {segment["status"] for segment in result["segments"]}
    assert {"translated", "same_language", "skipped"} <= statuses
    assert "".join(segment["original"] for segment in result["segments"]) == text


def test_the_acp_bridge_block_translates_the_thoughts(tmp_path: Path) -> None:
    """The recorded ACP session through the sidecar the block starts: every thought comes back
    through the sidecar, none passed on untranslated because it was not up yet."""
    pytest.importorskip("acp")
    block = readme_block("## In an agent server", "acp_bridge.py")
    code, stdout = run_block(block, tmp_path)
    assert code == 0, stdout
    statuses = []
    for line in stdout.splitlines():
        if not line.startswith("{"):
            continue  # the wait's line
        update = json.loads(line).get("params", {}).get("update", {})
        if update.get("sessionUpdate") == "agent_thought_chunk":
            statuses.append(update["_meta"]["thinktrans"]["status"])
    assert statuses and "translated" in statuses
    assert "error" not in statuses, statuses
