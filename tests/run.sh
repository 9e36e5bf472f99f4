#!/usr/bin/env bash
# The whole test suite: installs into .venv, then runs pytest, ruff and mypy.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
# The constraints file pins the CPU build of torch; GPU hosts install without it.
.venv/bin/python -m pip install -q --disable-pip-version-check -c .ci/constraints.txt -e '.[all,dev]'
.venv/bin/python -m pytest -q -p no:cacheprovider "$@"
.venv/bin/ruff check service models tests bench examples
.venv/bin/mypy service models
echo "tests, ruff and mypy passed"
