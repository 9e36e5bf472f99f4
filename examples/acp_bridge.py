"""Translate an ACP agent's thoughts on the wire: JSON-RPC lines in on stdin, out on stdout.

Every line goes out in order; ``agent_thought_chunk`` updates come out translated, with
the original in ``_meta.thinktrans.original``. The target is ``--target``, else the
client's ``initialize`` ``_meta.locale``, else the service's choice. With the sidecar
down, slow or failing, the thoughts pass through unchanged (status ``error``).

    THINKTRANS_BACKEND=passthrough thinktrans serve &
    python examples/acp_bridge.py --url http://127.0.0.1:8088 < examples/acp_trace.jsonl

Between a real agent and its client: ``agent | acp_bridge.py --url ... | client``.

It needs only ``thinktrans-client`` (``pip install ./client``), not the sidecar's package.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

# Run from a checkout without installing: client/ holds `thinktrans_client`.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "client"))

from thinktrans_client import ThinktransClient, ThoughtTranslator
from thinktrans_client.locale import InvalidLocale, canonicalize


@dataclass(frozen=True, slots=True)
class RawLine:
    """A line that is not JSON: passed on as it came, in its place."""

    text: str


async def bridge(url: str, target: str | None, token: str | None, timeout_s: float,
                 stdin: TextIO, stdout: TextIO) -> None:
    """Copy stdin to stdout line by line, thoughts translated."""

    async def send(message: Any) -> None:
        if isinstance(message, RawLine):
            line = message.text
        else:
            line = json.dumps(message, ensure_ascii=False, separators=(",", ":"))
        stdout.write(line + "\n")
        stdout.flush()

    async with ThinktransClient(url, token=token, timeout_s=timeout_s) as client:
        async with ThoughtTranslator(client, send, target=target) as translator:
            while line := await asyncio.to_thread(stdin.readline):
                line = line.rstrip("\r\n")
                if not line.strip():
                    continue
                try:
                    message: Any = json.loads(line)
                except ValueError:
                    message = RawLine(line)
                await translator.feed(message)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="thinktrans base URL, e.g. "
                        "http://127.0.0.1:8088")
    parser.add_argument("--target", help="BCP 47 target; default: initialize _meta.locale")
    parser.add_argument("--token", help="THINKTRANS_API_TOKEN of the service, if it has one")
    parser.add_argument("--timeout", type=float, default=2.0,
                        help="seconds a request may take before the thoughts pass through")
    parser.add_argument("-v", "--verbose", action="store_true", help="log to stderr")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        stream=sys.stderr, format="acp_bridge: %(name)s: %(message)s")
    target = None
    if args.target is not None:
        try:
            target = canonicalize(args.target)
        except InvalidLocale as exc:
            print(f"acp_bridge: --target: {exc}", file=sys.stderr)
            return 2
    try:
        asyncio.run(bridge(args.url, target, args.token, args.timeout, sys.stdin, sys.stdout))
    except BrokenPipeError:
        return 1  # the reader went away
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
