"""Copy (or build) the tiny assets once per machine and hand out their paths.

The directory is ``$DFLASH_ASSETS_DIR`` if set, else ``~/.cache/dflash-pipeline/<ASSETS_VERSION>``.
Concurrent callers are safe: a file lock lets one process build while the others wait, and the
build happens in a temporary sibling directory that is renamed into place only when complete,
so a half-built directory is never visible under the final name. A fresh directory gets the
build shipped with the package where it is this code's (pipeline/assets/shipped.py), else a
build of its own. Each use checks the files against the sizes and sha256 sums recorded when
they were cached (pipeline/assets/cache_entry.py): a damaged directory is copied (or built)
again, with one line saying so, and building folders a killed run left are removed.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from typing import Optional

from pipeline.assets import cache_entry
from pipeline.assets.build import MANIFEST, TARGET_DIR, build_tiny_assets
from pipeline.assets.cache_entry import file_lock
from pipeline.assets.chat_data import DATA_FILES
from pipeline.assets.recipe import ASSETS_VERSION, recipe_changes
from pipeline.assets.shipped import copy_shipped

log = logging.getLogger(__name__)

ENV_VAR = "DFLASH_ASSETS_DIR"


@dataclass(frozen=True)
class TinyAssets:
    root: str
    target_dir: str  # HF model + tokenizer folder
    train_path: str  # JSONL, OpenAI messages form
    heldout_path: str

    @classmethod
    def at(cls, root: str) -> "TinyAssets":
        return cls(root, os.path.join(root, TARGET_DIR),
                   os.path.join(root, DATA_FILES["train"]),
                   os.path.join(root, DATA_FILES["heldout"]))

    def manifest(self) -> dict:
        with open(os.path.join(self.root, MANIFEST)) as f:
            return json.load(f)


def default_assets_dir() -> str:
    default = os.path.join("~", ".cache", "dflash-pipeline", ASSETS_VERSION)
    return os.path.abspath(os.path.expanduser(os.environ.get(ENV_VAR) or default))


def ensure_tiny_assets(root: Optional[str] = None) -> TinyAssets:
    """The tiny assets under ``root`` (default: :func:`default_assets_dir`), built if missing."""
    root = os.path.abspath(os.path.expanduser(root)) if root else default_assets_dir()
    lock = root + ".lock"
    cache_entry.sweep_leftovers(root, lock)
    if not _is_built(root) or _damage(root):
        os.makedirs(os.path.dirname(root), exist_ok=True)
        with file_lock(lock):
            damage = _damage(root)  # another process may have built or mended it meanwhile
            if damage:
                log.warning("%s: the tiny demo assets in %s are damaged; making them again",
                            damage, root)
                cache_entry.discard(root)
            if not _is_built(root):
                _build_atomically(root)
    _check_version(root)
    cache_entry.adopt(root)
    return TinyAssets.at(root)


def _is_built(root: str) -> bool:
    return os.path.isfile(os.path.join(root, MANIFEST))


def _damage(root: str) -> Optional[str]:
    return cache_entry.problem(root) if _is_built(root) else None


def _build_atomically(root: str) -> None:
    if os.path.exists(root) and os.listdir(root):
        raise ValueError(f"{root} exists but holds no finished asset build ({MANIFEST} is "
                         f"missing); delete it or set {ENV_VAR} to another directory")
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(root)}.building-",
                           dir=os.path.dirname(root))
    try:
        copied = copy_shipped(tmp)
        if not copied:
            log.info("building the tiny DFlash demo assets in %s (once; under a minute)", root)
            manifest = build_tiny_assets(tmp)
        cache_entry.write_listing(tmp)
        os.rename(tmp, root)  # atomic; replaces an empty directory left by a caller
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if copied:
        log.info("copied the tiny demo assets shipped with the package into %s", root)
    else:
        log.info("built the tiny assets in %.1f s: %s", manifest["build_time_s"], root)


def _check_version(root: str) -> None:
    """Refuse a build of another version, or of another recipe under this version (a recipe
    changed without bumping ASSETS_VERSION would otherwise be served from a stale cache)."""
    with open(os.path.join(root, MANIFEST)) as f:
        manifest = json.load(f)
    version = manifest.get("version")
    if version != ASSETS_VERSION:
        raise ValueError(f"{root} holds tiny assets version {version!r}, this code needs "
                         f"{ASSETS_VERSION!r}; delete the directory to rebuild it")
    changed = recipe_changes(manifest)
    if changed:
        diff = ", ".join(f"{k} {built!r} -> {wanted!r}" for k, (built, wanted) in changed.items())
        raise ValueError(f"{root} holds tiny assets {version!r} of another recipe ({diff}); "
                         f"delete the directory to rebuild it (a recipe change must bump "
                         f"ASSETS_VERSION in pipeline/assets/recipe.py)")
