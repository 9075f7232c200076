#!/usr/bin/env bash
# Set up everything this project needs on a fresh machine, idempotently:
#   * Debian's `minizinc` package (brings the Gecode solver), via apt-get as root or sudo;
#   * a virtual environment in .venv with the project installed in editable mode
#     (pinned TVM 0.27 + ffi 0.1.14.post1, torch 2.13.0 CPU, test tools).
# Re-running it is cheap: each step is skipped when already done.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"

if ! command -v minizinc >/dev/null 2>&1; then
  echo "[setup] installing Debian package 'minizinc' (MiniZinc + Gecode)"
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq minizinc >/dev/null
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq minizinc >/dev/null
  else
    echo "[setup] ERROR: MiniZinc is missing and this user can neither run apt-get as root nor sudo." >&2
    echo "[setup]        Ask an administrator to run: apt-get install minizinc" >&2
    exit 1
  fi
fi

py="${PYTHON:-python3}"
stamp=".venv/.installed-$(sha1sum setup.py | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  echo "[setup] creating .venv and installing the project (first run takes a few minutes)"
  [ -d .venv ] || "$py" -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
  # torch first, pinned, so nothing later pulls a CUDA build
  .venv/bin/python -m pip install -q "torch==2.13.0"
  .venv/bin/python -m pip install -q -e ".[test,torch]"
  rm -f .venv/.installed-*
  touch "$stamp"
fi
echo "[setup] ready: $(.venv/bin/python -c 'import tvm, tvm_ffi; print("tvm", tvm.__version__, "ffi", tvm_ffi.__version__)' 2>/dev/null | tail -1), $(minizinc --version | head -1)"
