"""wandb's own switches: what we pass to ``wandb.init``, and whether it can log at all.

Arguments given to ``wandb.init`` override wandb's environment variables, so only the logger
keys a user set are passed. ``WANDB_MODE``, ``WANDB_PROJECT`` and ``WANDB_ENTITY`` then work as
wandb documents them. An online run without credentials would stop inside ``wandb.init``
after every actor started; :func:`check_wandb` says so in one line before anything starts.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Mapping, Optional

from pipeline.preflight import PreflightError

log = logging.getLogger(__name__)

# Our project name when neither logger.project nor WANDB_PROJECT names one.
DEFAULT_PROJECT = "dflash"
# Modes in which wandb never talks to a server, so it needs no key.
_LOCAL_MODES = ("offline", "disabled", "dryrun")


def wandb_init_switches(logger: Any, environ: Mapping[str, str] = os.environ) -> dict:
    """``project``/``entity``/``name``/``mode`` for ``wandb.init``: only those set by the user."""
    switches = {}
    if logger.project is not None:
        switches["project"] = logger.project
    elif not environ.get("WANDB_PROJECT"):
        switches["project"] = DEFAULT_PROJECT
    for key in ("entity", "name", "mode"):
        if getattr(logger, key) is not None:
            switches[key] = getattr(logger, key)
    return switches


def check_wandb(logger: Any, environ: Mapping[str, str] = os.environ) -> None:
    """Stop before any actor starts when an online wandb run has no credentials."""
    if logger.kind != "wandb":
        return
    settings = _wandb_settings(environ)
    mode = logger.mode or (settings.mode if settings is not None else None) \
        or environ.get("WANDB_MODE") or "online"
    if mode in _LOCAL_MODES or _has_credentials(settings, environ):
        return
    where = "logger.mode=online" if logger.mode else "logger=wandb with no mode set"
    raise PreflightError(
        f"{where}, but wandb has no API key: run `wandb login` (or set WANDB_API_KEY), or log "
        "locally with WANDB_MODE=offline or logger.mode=offline (logger=none turns wandb off)")


def _wandb_settings(environ: Mapping[str, str]) -> Optional[Any]:
    """wandb's settings as ``wandb.init`` would read them (settings file, then environment).

    Built afresh rather than through ``wandb.setup()``: that one caches the environment of the
    first call for the life of the process and starts wandb's service.
    """
    try:
        from wandb import Settings

        settings = Settings()
        config_dir = environ.get("WANDB_CONFIG_DIR") or os.path.expanduser("~/.config/wandb")
        settings.settings_system = os.path.join(config_dir, "settings")
        settings.update_from_system_settings()
        settings.update_from_env_vars(dict(environ))
        return settings
    except Exception as e:  # a wandb version without these hooks: fall back to the environment
        log.debug("wandb settings unavailable (%s); reading WANDB_* variables only", e)
        return None


def _has_credentials(settings: Optional[Any], environ: Mapping[str, str]) -> bool:
    if environ.get("WANDB_API_KEY") or environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    if settings is not None and getattr(settings, "api_key", None):
        return True
    base_url = getattr(settings, "base_url", None) or environ.get("WANDB_BASE_URL") \
        or "https://api.wandb.ai"
    return _netrc_has(base_url, environ)


def _netrc_has(base_url: str, environ: Mapping[str, str]) -> bool:
    """`wandb login` stores the key in the netrc file under the server's host name."""
    import netrc
    from urllib.parse import urlparse

    path = environ.get("NETRC") or os.path.expanduser("~/.netrc")
    host = urlparse(base_url).hostname or base_url
    try:
        entry = netrc.netrc(path).authenticators(host)
    except (OSError, netrc.NetrcParseError):
        return False
    return bool(entry and entry[2])
