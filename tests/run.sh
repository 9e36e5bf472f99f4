#!/usr/bin/env bash
# The whole test suite: installs into .venv, then runs pytest, ruff and mypy.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
# The constraints file pins torch to the CPU wheel this machine kind carries on disk; on
# other hosts, see the README for getting the CPU build. The agent-side client (client/)
# is its own distribution; the server's tests drive it against a served sidecar.
.venv/bin/python -m pip install -q --disable-pip-version-check -c .ci/constraints.txt \
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
.venv/bin/pytest -q -p no:cacheprovider --durations=25 "$@"
.venv/bin/ruff check service models client tests bench examples
.venv/bin/mypy service models client/thinktrans_client
echo "tests, ruff and mypy passed"
