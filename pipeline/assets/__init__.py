"""The embedded demo: a tiny Qwen3 target, its tokenizer and chat data, built locally.

Nothing is downloaded and nothing is built at import; :func:`ensure_tiny_assets` copies the
build shipped with the package (pipeline/assets/shipped.py), or builds one where that is not
this code's (under a minute of one core), once, into its cache folder.
"""

from pipeline.assets.cache import TinyAssets, default_assets_dir, ensure_tiny_assets
from pipeline.assets.resolve import resolve_data_path, resolve_target_path

__all__ = ["TinyAssets", "default_assets_dir", "ensure_tiny_assets", "resolve_data_path",
           "resolve_target_path"]
