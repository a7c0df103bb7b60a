"""The peers' Python environment: their wheels beside the project's venv, never in it.

Both peers run on the project's torch and transformers. Installed with their declared
dependencies they would move them (speculators pins transformers<=5.19 and pulls torchvision and
torchaudio, which took torch to 2.14.1), so they are installed with ``--no-deps`` into a folder
of their own together with what they really import and the venv lacks (found by importing their
training, export and data modules), and reach the peers' processes through ``PYTHONPATH``.

Where the peers import already (the GPU machine, after ``bash .devbundle/install`` put the
carried wheels in /tmp/site on ``PYTHONPATH``), nothing is installed. Elsewhere the folder is
``$DFLASH_PEERS_SITE`` or ``~/.cache/dflash_bench/peers-<hash of the pins>``, installed once by
pip from the package index (``python -m bench.peers --install-peers`` does only that).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

log = logging.getLogger(__name__)

PEERS = ("nvidia-modelopt==0.47.0", "speculators==0.9.0", "hs-connectors==0.9.0")
# What the peers import that the project's venv does not have, at versions their metadata
# allow (datasets<=5.1 and loguru<=0.7.3 for speculators, pulp<4 for modelopt; modelopt also
# imports requests, which it does not declare and the venv has).
MISSING_DEPS = ("pulp==3.3.2", "openai==3.63.0", "datasets==5.1.0", "multiprocess==0.70.19",
                "dill==0.4.1", "pyarrow==26.0.1", "pandas==3.1.1", "scipy==1.17.1",
                "python-dateutil==2.9.0.post0", "six==1.17.0", "tzdata==2026.6",
                "pydantic-settings==2.16.3", "loguru==0.7.3", "python-dotenv==1.2.4",
                # The GPU image's transformers (and the hub it needs) for the peers' processes
                # alone: modelopt 0.47's DFlash fails on the venv's 5.25 (its rotary embedding
                # is built with a ``device`` argument 5.18 removed); speculators allows <=5.19.
                "transformers==5.17.0", "huggingface-hub==1.33.0")
# The modules each peer's path through this bench imports.
PROBE = ("modelopt.torch.speculative", "modelopt.recipe", "speculators.train.cli",
         "speculators.cli.prepare_data", "speculators.convert.dflash.converter")
VERSIONS = ("nvidia-modelopt", "speculators", "hs-connectors", "torch", "transformers",
            "datasets", "pydantic")


def default_site() -> Path:
    digest = hashlib.sha256("\n".join((*PEERS, *MISSING_DEPS, sys.version)).encode())
    root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return root / "dflash_bench" / f"peers-{digest.hexdigest()[:12]}"


def with_site(env: dict, site: Optional[Path]) -> dict:
    """``env`` with ``site`` first on PYTHONPATH (none: unchanged)."""
    env = dict(env)
    if site is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH"))
                                            if p)
    return env


def probe(env: dict) -> Optional[str]:
    """None where the peers import in ``env``, else the last line of the error."""
    code = "import importlib, sys\nfor m in sys.argv[1:]: importlib.import_module(m)"
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", code, *PROBE], env=env,
                          capture_output=True, text=True, timeout=300)
    if done.returncode == 0:
        return None
    lines = (done.stderr or done.stdout).strip().splitlines()
    return lines[-1] if lines else f"exit {done.returncode}"


def install(site: Path) -> None:
    """pip --no-deps --target: the peers and their missing dependencies."""
    log.info("installing the peers into %s (once): %s", site, " ".join((*PEERS, *MISSING_DEPS)))
    staging = site.with_name(site.name + ".partial")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile",
                    "--target", str(staging), *PEERS, *MISSING_DEPS], check=True)
    os.replace(staging, site)


def peers_env(allow_install: bool, site: Optional[Path] = None) -> tuple[dict, Optional[str]]:
    """(environment for the peers' processes, None) or (the environment, why they cannot
    run): the current environment where they import, else the site folder (installed if
    allowed)."""
    base = dict(os.environ)
    if probe(base) is None:
        return base, None
    site = site or Path(os.environ.get("DFLASH_PEERS_SITE") or default_site())
    if not site.exists():
        if not allow_install:
            return base, ("the peers are not installed (run python -m bench.peers "
                          "--install-peers, or carry their wheels: bench/peers.py)")
        try:
            install(site)
        except (subprocess.CalledProcessError, OSError) as e:
            return base, f"installing the peers failed: {e}"
    env = with_site(base, site)
    why = probe(env)
    return env, (None if why is None else f"the peers do not import: {why}")


def versions(env: dict) -> dict:
    """Installed versions of the peers and of what they run on, as the peers' processes see
    them."""
    code = ("import json, importlib.metadata as m, sys\nout = {}\nfor n in sys.argv[1:]:\n"
            "    try: out[n] = m.version(n)\n    except m.PackageNotFoundError: out[n] = None\n"
            "print(json.dumps(out))")
    done = subprocess.run([sys.executable, "-c", code, *VERSIONS], env=env,
                          capture_output=True, text=True, timeout=120)
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {"error": (done.stderr or "").strip()[-300:]}
