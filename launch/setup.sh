#!/usr/bin/env bash
# Set up a fresh machine: a virtual environment in .venv with the project and its dev tools.
#   bash launch/setup.sh            # then .venv/bin/python -m pipeline.train
# TORCH_SPEC picks the torch build (default: the 2.13.0 CPU wheel; "torch" for a CUDA build).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# Install torch first and on its own, so the project's range does not pull a multi-GB CUDA build.
.venv/bin/python -c "import torch" 2>/dev/null || .venv/bin/python -m pip install -q "${TORCH_SPEC:-torch==2.13.0}"
.venv/bin/python -m pip install -q -e ".[dev]"
# Bytecode for the project's own modules, written once here: where the environment sets
# PYTHONDONTWRITEBYTECODE (this development machine does), every process (the driver, each Ray
# actor, each CLI run of the suite) would otherwise compile them from source again, about 0.1
# CPU-s each. Python checks each file's source stamp, so a stale one is compiled afresh.
.venv/bin/python -m compileall -q pipeline bench tests > /dev/null
