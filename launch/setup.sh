#!/usr/bin/env bash
# Set up a fresh machine: a virtual environment in .venv with the project and its dev tools.
#   bash launch/setup.sh            # then .venv/bin/python -m pipeline.train
# TORCH_SPEC picks the torch build (default: the 2.13.0 CPU wheel; "torch" for a CUDA build).
# SETUP_INSTALLER=pip installs with pip alone (the default is uv, falling back to pip).
set -euo pipefail
cd "$(dirname "$0")/.."
installer=${SETUP_INSTALLER:-uv}
case $installer in
    uv | pip) ;;
    *) echo "setup: SETUP_INSTALLER=$installer: allowed uv, pip" >&2; exit 2 ;;
esac
python3 -m venv .venv
py=.venv/bin/python
torch_spec=${TORCH_SPEC:-torch==2.13.0}

# Torch first and on its own, so the project's range does not pull a multi-GB CUDA build;
# then the project. "$@" is the installer's command line.
install() {
    $py -c "import torch" 2>/dev/null || "$@" "$torch_spec" || return
    "$@" -e ".[dev]"
}

# pip's way: a minute on a 2-core machine, most of it unpacking wheels one at a time.
with_pip() {
    $py -m pip install -q --upgrade pip && install $py -m pip install -q
}

# uv installs the same packages (the same resolution, checked against pip's) in 39 s where
# pip takes 66 (a new 2-core machine). It does not read pip's configuration, so the wheel
# folders pip is told to look in (this machine's local torch builds) are handed on. Bytecode
# is compiled at install as pip does: where PYTHONDONTWRITEBYTECODE is set, each process
# would otherwise compile torch's modules from source on every import (3.8 s for
# `import torch` against 1.3).
with_uv() {
    $py -m pip install -q uv || return
    local links=${PIP_FIND_LINKS:-$($py -m pip config get global.find-links 2>/dev/null || true)}
    local args=(--quiet --compile-bytecode --python "$py")
    for dir in $links; do args+=(--find-links "$dir"); done
    install .venv/bin/uv pip install "${args[@]}"
}

if [ "$installer" = pip ]; then
    with_pip
elif ! with_uv; then
    echo "setup: uv could not install the environment (above); installing with pip instead" >&2
    with_pip
fi
# Bytecode for the project's own modules, written once here: where the environment sets
# PYTHONDONTWRITEBYTECODE (this development machine does), every process (the driver, each Ray
# actor, each CLI run of the suite) would otherwise compile them from source again, about 0.1
# CPU-s each. Python checks each file's source stamp, so a stale one is compiled afresh.
$py -m compileall -q pipeline bench tests > /dev/null
