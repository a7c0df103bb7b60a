"""wandb's own switches: what we pass to ``wandb.init``, and whether it can log at all.

Arguments given to ``wandb.init`` override wandb's environment variables, so only the logger
keys a user set are passed. ``WANDB_MODE``, ``WANDB_PROJECT`` and ``WANDB_ENTITY`` then work as
wandb documents them. An online run without credentials, or without a server that answers,
would stop inside ``wandb.init`` after every actor started (with no network, a traceback after
about 90 s of wandb's retries); :func:`check_wandb` says so in one line before anything starts:
it asks the server once, with the key, who the key's user is.
"""

from __future__ import annotations

import base64
import logging
import os
import urllib.error
import urllib.request
from typing import Any, Mapping, Optional

from pipeline.checks.preflight import PreflightError

log = logging.getLogger(__name__)

# Our project name when neither logger.project nor WANDB_PROJECT names one.
DEFAULT_PROJECT = "dflash"
# Modes in which wandb never talks to a server, so it needs no key.
_LOCAL_MODES = ("offline", "disabled", "dryrun")
# How long the one check of the server may take: a server that answers takes well under a
# second; a network that drops the packets gives no answer at all.
SERVER_TIMEOUT_S = 10.0


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
    """Stop before any actor starts when an online wandb run has no credentials, or its server
    does not answer or refuses the key."""
    if logger.kind != "wandb":
        return
    settings = _wandb_settings(environ)
    mode = logger.mode or (settings.mode if settings is not None else None) \
        or environ.get("WANDB_MODE") or "online"
    if mode in _LOCAL_MODES:
        return
    where = "logger.mode=online" if logger.mode else "logger=wandb with no mode set"
    offline = ("log locally with WANDB_MODE=offline or logger.mode=offline (logger=none turns "
               "wandb off)")
    base_url = getattr(settings, "base_url", None) or environ.get("WANDB_BASE_URL") \
        or "https://api.wandb.ai"
    key = _api_key(settings, environ, base_url)
    if key is None and not environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        raise PreflightError(
            f"{where}, but wandb has no API key: run `wandb login` (or set WANDB_API_KEY), or "
            f"{offline}")
    why = server_problem(base_url, key)
    if why is not None:
        raise PreflightError(f"{where}, but {why}, or {offline}")


def server_problem(base_url: str, key: Optional[str]) -> Optional[str]:
    """Why the wandb server at ``base_url`` would fail the run, and what to do (one phrase),
    or None.

    One GraphQL request for the key's user, as `wandb login --verify` makes: a refused key is
    HTTP 401 or 403. Any other answer means the server is there (wandb's own retries cope
    with a passing error); no answer at all is what fails after every actor started.
    """
    request = urllib.request.Request(
        base_url.rstrip("/") + "/graphql", data=b'{"query": "query { viewer { id } }"}',
        headers={"Content-Type": "application/json"})
    if key is not None:
        token = base64.b64encode(f"api:{key}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=SERVER_TIMEOUT_S) as answer:
            answer.read(1 << 16)
    except urllib.error.HTTPError as e:
        if e.code in (401, 403) and key is not None:
            return (f"the wandb server at {base_url} refused the API key (HTTP {e.code}): run "
                    f"`wandb login` again (or set WANDB_API_KEY)")
        log.warning("the wandb server at %s answered HTTP %d (%s) to a check of the key; "
                    "starting anyway", base_url, e.code, e.reason)
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", None) or e
        return (f"the wandb server at {base_url} cannot be reached ({reason}): check the "
                f"network and WANDB_BASE_URL")
    return None


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


def _api_key(settings: Optional[Any], environ: Mapping[str, str],
             base_url: str) -> Optional[str]:
    """The API key wandb.init would use: the variable, the settings, or the netrc file."""
    key = environ.get("WANDB_API_KEY") or getattr(settings, "api_key", None)
    return key or _netrc_key(base_url, environ)


def _netrc_key(base_url: str, environ: Mapping[str, str]) -> Optional[str]:
    """`wandb login` stores the key in the netrc file under the server's host name."""
    import netrc
    from urllib.parse import urlparse

    path = environ.get("NETRC") or os.path.expanduser("~/.netrc")
    host = urlparse(base_url).hostname or base_url
    try:
        entry = netrc.netrc(path).authenticators(host)
    except (OSError, netrc.NetrcParseError):
        return None
    return entry[2] if entry and entry[2] else None
