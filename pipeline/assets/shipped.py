"""The tiny assets as built once and shipped with the package, so a fresh machine copies 2.4 MB
instead of building them (about 35 s of one core: the target's training and its greedy answers).

The build stays the source (pipeline/assets/build.py): a shipped copy is used only where its
manifest names this code's ``ASSETS_VERSION`` and recipe and every file matches its sha256 in
``SHA256SUMS``; otherwise the assets are built as before. One build everywhere also gives every
machine the same target: built locally, the target's bits follow the machine's float rounding
and the Python version's help text (its training corpus).

After a recipe change (which bumps ``ASSETS_VERSION``), ship the new build with
``python -m pipeline.assets.shipped`` (tests/assets/test_shipped.py fails until then).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import sys
from pathlib import Path
from typing import Optional

from pipeline.assets.recipe import ASSETS_VERSION, recipe_changes

log = logging.getLogger(__name__)

SHIPPED_ROOT = Path(__file__).resolve().parent / "shipped_builds"
SUMS = "SHA256SUMS"


def shipped_dir(root: Path = SHIPPED_ROOT) -> Path:
    return root / ASSETS_VERSION


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")
                  if p.is_file() and p.name != SUMS)


def why_unusable(folder: Path) -> Optional[str]:
    """None where ``folder`` holds a shipped build this code can use, else why not."""
    manifest = folder / "manifest.json"
    if not manifest.is_file():
        return f"no shipped build of {ASSETS_VERSION} in {folder.parent}"
    built = json.loads(manifest.read_text())
    if built.get("version") != ASSETS_VERSION or recipe_changes(built):
        return f"the shipped build in {folder} is of another version or recipe"
    sums = dict(line.split("  ", 1)[::-1] for line in (folder / SUMS).read_text().splitlines()
                if line) if (folder / SUMS).is_file() else {}
    if sorted(sums) != _files(folder):
        return f"{folder / SUMS} does not list exactly the shipped files"
    bad = [name for name, digest in sums.items() if _sha256(folder / name) != digest]
    if bad:
        return f"shipped files changed since they were shipped: {', '.join(bad)}"
    return None


def copy_shipped(dest: str, folder: Optional[Path] = None) -> bool:
    """Copy the shipped build into the empty folder ``dest``; False (with one line saying why)
    where there is none this code can use, and the caller builds instead."""
    folder = folder or shipped_dir()
    why = why_unusable(folder)
    if why is not None:
        if folder.exists():  # a missing one is the normal case in a recipe's development
            log.warning("%s: building the tiny assets instead", why)
        return False
    shutil.copytree(folder, dest, dirs_exist_ok=True, ignore=shutil.ignore_patterns(SUMS))
    return True


def write_sums(folder: Path) -> None:
    (folder / SUMS).write_text("".join(f"{_sha256(folder / name)}  {name}\n"
                                       for name in _files(folder)))


def ship(built_root: str, root: Path = SHIPPED_ROOT) -> Path:
    """Replace the shipped build with the finished build in ``built_root``, with its sums."""
    folder = shipped_dir(root)
    if folder.exists():
        shutil.rmtree(folder)
    shutil.copytree(built_root, folder, ignore=shutil.ignore_patterns(SUMS))
    write_sums(folder)
    return folder


def main() -> int:
    """Build the assets from the recipe in a temporary folder and ship that build."""
    import tempfile

    from pipeline.assets.build import build_tiny_assets

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with tempfile.TemporaryDirectory() as tmp:
        build_tiny_assets(tmp)
        for stale in SHIPPED_ROOT.glob("*") if SHIPPED_ROOT.exists() else []:
            if stale.name != ASSETS_VERSION:
                shutil.rmtree(stale)
        folder = ship(tmp)
        why = why_unusable(folder)
        if why is not None:
            raise SystemExit(f"pipeline.assets.shipped: {why}")
        print(f"shipped {folder}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    raise SystemExit(main())
