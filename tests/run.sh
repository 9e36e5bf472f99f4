#!/usr/bin/env bash
# The whole test suite: installs into .venv, then runs pytest, ruff and mypy.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
# The CPU build of torch, as the README's first command takes it: the constraints file pins
# the version, PyTorch's CPU index has it as 2.13.0+cpu (PyPI's is the CUDA build on
# Linux); where that index cannot be reached, pip takes the CPU wheel found on disk, and
# --retries 1 keeps the unreachable index from costing minutes. The agent-side client
# (client/) is its own distribution; the server's tests drive it against a served sidecar.
.venv/bin/python -m pip install -q --disable-pip-version-check --retries 1 \
    -c .ci/constraints.txt --extra-index-url https://download.pytorch.org/whl/cpu \
    -e '.[all,dev]' -e './client[acp]'
# The viewer's browser tests drive a real Chromium: Debian's, installed here where none is
# found (they skip, saying so, where none can be had).
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
    as_root=""
    [ "$(id -u)" = 0 ] || as_root="sudo -n"
    { $as_root apt-get install -y -q chromium >/dev/null 2>&1 \
        || { $as_root apt-get update -q >/dev/null 2>&1 \
             && $as_root apt-get install -y -q chromium >/dev/null 2>&1; }; } \
        || echo "no Chromium could be installed: the viewer's browser tests will skip" >&2
fi
# The DeepL tests run against DeepL's own mock server too (tests/deepl-mock/, a Node.js
# program): Debian's nodejs and npm, installed here where either is missing (those tests
# skip, saying so, where none can be had). Its packages come from the npm registry, once
# per version of its package-lock.json (tests/deepl_mock.py).
if { ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; } \
        && command -v apt-get >/dev/null 2>&1; then
    as_root=""
    [ "$(id -u)" = 0 ] || as_root="sudo -n"
    { $as_root apt-get install -y -q nodejs npm >/dev/null 2>&1 \
        || { $as_root apt-get update -q >/dev/null 2>&1 \
             && $as_root apt-get install -y -q nodejs npm >/dev/null 2>&1; }; } \
        || echo "no Node.js and npm could be installed: the tests against DeepL's mock" \
                "server will skip" >&2
fi
# Tests run in parallel (pytest-xdist), a module to a worker: modules that share one
# expensive server (Ray, Chromium, a served sidecar) start it once. Most tests wait on
# sockets and servers, so there are more workers than cores (TEST_WORKERS to change it; 0
# runs them in this process). Ruff and mypy run whatever pytest said.
workers=${TEST_WORKERS:-$(( $(nproc) + 1 ))}
failed=()
.venv/bin/pytest -q -p no:cacheprovider --durations=25 -n "$workers" "$@" || failed+=(pytest)
.venv/bin/ruff check service models pool client tests bench examples || failed+=(ruff)
.venv/bin/mypy service models pool client/thinktrans_client || failed+=(mypy)
if [ ${#failed[@]} -gt 0 ]; then
    echo "failed: ${failed[*]}" >&2
    exit 1
fi
echo "tests, ruff and mypy passed"
