"""Translate a recorded ACP session's thoughts: JSON-RPC lines in on stdin, out on stdout.

A thin wrapper of ``thinktrans_client.proxy.translate_stdio``, the agent-to-client half of
``thinktrans-acp`` (which launches a live agent; use that between an editor and an agent).
Every line goes out in order, untouched, but ``agent_thought_chunk`` updates, which come out
translated with the original in ``_meta.thinktrans.original``. The target is ``--target``,
else the session's or the client's ``_meta.locale``, else the service's choice. With the
sidecar down, slow or failing, the thoughts pass through unchanged (status ``error``).

    THINKTRANS_BACKEND=passthrough thinktrans serve &
    thinktrans health --wait 60
    python examples/acp_bridge.py --url http://127.0.0.1:8088 < examples/acp_trace.jsonl

It needs only ``thinktrans-client[acp]`` (``pip install './client[acp]'``), not the
sidecar's package.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

# Run from a checkout without installing: client/ holds `thinktrans_client`.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "client"))

try:
    from thinktrans_client.locale import InvalidLocale, canonicalize
    from thinktrans_client.proxy import ProxyError, translate_stdio
except ModuleNotFoundError as exc:  # this Python lacks the client or its httpx
    sys.exit(f"acp_bridge.py: needs thinktrans-client (no module {exc.name!r} here): "
             "pip install './client[acp]' from a checkout, or 'thinktrans-client[acp]'")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="thinktrans base URL, e.g. "
                        "http://127.0.0.1:8088")
    parser.add_argument("--target", help="BCP 47 target; default: the recorded _meta.locale")
    parser.add_argument("--token", help="THINKTRANS_API_TOKEN of the service, if it has one")
    parser.add_argument("--timeout", type=float, default=2.0,
                        help="seconds a request may take before the thoughts pass through")
    parser.add_argument("-v", "--verbose", action="store_true", help="log to stderr")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        stream=sys.stderr, format="acp_bridge: %(name)s: %(message)s")
    try:
        target = None if args.target is None else canonicalize(args.target)
    except InvalidLocale as exc:
        print(f"acp_bridge: --target: {exc}", file=sys.stderr)
        return 2
    try:
        asyncio.run(translate_stdio(url=args.url, token=args.token, target=target,
                                    timeout_s=args.timeout))
    except ProxyError as exc:
        print(f"acp_bridge: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 1  # the reader went away
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
