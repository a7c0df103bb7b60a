"""Which config keys exist: a key the schema does not know stops the job, however it came in.

Hydra refuses an unknown ``key=value`` against the structured schema, but ``+key=value`` adds
the key anyway, and ``OmegaConf.to_object`` then drops it: ``+train.optim.weight_decy=0.1``
would train with weight_decay 0.0 and no word. :func:`reject_unknown_keys` walks the composed
config against the dataclasses and refuses such a key, naming the section's keys and the
nearest one; :func:`reject_unknown_override` does the same for one command-line override,
before Hydra (whose own refusal is several lines, and suggests the ``+`` that would drop it).
Free-form sections (``dict`` fields such as ``logger.wandb_init``) take any key.
:func:`field_type` and :func:`expected` name what a key takes, for a refused value.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import typing
from typing import Any, Sequence


def reject_unknown_keys(cfg: Any, schema: type) -> None:
    """ValueError for the first key of ``cfg`` (a DictConfig) that ``schema`` has no field for."""
    from omegaconf import DictConfig

    _walk(cfg, schema, "", DictConfig)


def _walk(node: Any, schema: type, prefix: str, dict_config: type) -> None:
    fields = {f.name: f for f in dataclasses.fields(schema)}
    hints = typing.get_type_hints(schema)
    for key in node.keys():
        name = f"{prefix}{key}"
        if key not in fields:
            raise ValueError(_unknown(name, prefix, sorted(fields)))
        sub = _dataclass_of(hints[key])
        if sub is not None and isinstance(node[key], dict_config):
            _walk(node[key], sub, f"{name}.", dict_config)


def _dataclass_of(hint: Any) -> type | None:
    """The dataclass a field holds (``Optional[X]`` included), or None for other types."""
    if dataclasses.is_dataclass(hint):
        return hint
    for arg in typing.get_args(hint):
        if dataclasses.is_dataclass(arg):
            return arg
    return None


def _unknown(name: str, prefix: str, known: list[str]) -> str:
    section = prefix.rstrip(".") or "the top level"
    leaf = name[len(prefix):]
    near = difflib.get_close_matches(leaf, known, n=1)
    hint = f"; did you mean {prefix}{near[0]}?" if near else ""
    return f"{name} is not a config key{hint} ({section} has {', '.join(known)})"


def reject_unknown_override(override: str, schema: type) -> None:
    """ValueError when the dotted key of ``override`` names no field of ``schema``.

    Only the key's path is checked: a key that ends on a section (``cluster=node8``) is a
    config group's option, which Hydra checks; keys of Hydra's own config (``hydra.run.dir``)
    and group paths (``hydra/job_logging``, ``group@package``) are Hydra's to check.
    """
    key = override_key(override)
    if key.split(".")[0] == "hydra" or "/" in key or "@" in key:
        return
    hint = field_type(key, schema)
    if override.startswith("+") and not override.startswith("++") and hint is not None:
        raise ValueError(f"{override}: {key} is a config key already: set it without the "
                         f"'+' ({override[1:]})")


def field_type(key: str, schema: type) -> Any:
    """The type hint of dotted ``key`` in ``schema``; None inside a free-form section.
    ValueError naming the nearest key when ``key`` is not in the schema."""
    hint: Any = schema
    parts = key.split(".")
    for i, part in enumerate(parts):
        node = _dataclass_of(hint)
        if node is None:  # a free-form dict, or a list's item: the schema stops here
            return None
        fields = {f.name for f in dataclasses.fields(node)}
        if part not in fields:
            prefix = "".join(f"{p}." for p in parts[:i])
            raise ValueError(_unknown(f"{prefix}{part}", prefix, sorted(fields)))
        hint = typing.get_type_hints(node)[part]
    return hint


def expected(hint: Any) -> str:
    """What a field of type ``hint`` takes, in words: ``an int``, ``a list of float``."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union:
        kinds = [w for a in args if a is not type(None)
                 for w in (["true", "false"] if a is bool else [expected(a)])]
        kinds += ["null"] if type(None) in args else []
        return ", ".join(kinds[:-1]) + " or " + kinds[-1] if len(kinds) > 1 else kinds[0]
    if origin is typing.Literal:
        return f"one of {list(args)}"
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return f"one of {[m.name for m in hint]}"
    if dataclasses.is_dataclass(hint):
        return "a section"
    if origin in (list, tuple, typing.Sequence) or hint in (list, tuple):
        item = next((a for a in args if a is not Ellipsis), None)
        return f"a list of {_name(item)}" if item is not None else "a list"
    if origin is dict or hint is dict:
        return "a mapping ({key: value, ...})"
    return {int: "an int", float: "a float", bool: "true or false",
            str: "a string"}.get(hint, _name(hint))


def _name(hint: Any) -> str:
    return getattr(hint, "__name__", str(hint))


# Keys that moved when TrainConfig was split into sections: an override of the old name stops
# with the new one (Hydra alone would only say the key is unknown).
MOVED_KEYS = {
    **{f"train.{k}": f"train.plan.{k}" for k in ("epochs", "max_steps", "stop_at_step",
                                                  "grad_accum")},
    **{f"train.{k}": f"train.optim.{k}" for k in ("lr", "warmup_ratio", "min_lr_ratio",
                                                   "weight_decay", "betas", "grad_clip")},
    "train.eval_every": "train.eval.every",
    "train.eval_prompts": "train.eval.prompts",
    "train.eval_max_new_tokens": "train.eval.max_new_tokens",
    "train.save_every": "train.checkpoint.every",
    "train.resume": "train.checkpoint.resume",
    "train.keep_last": "train.checkpoint.keep_last",
    "train.max_restarts": "train.recovery.max_restarts",
}


def override_key(override: str) -> str:
    """The dotted key of a Hydra override (``+key=v``, ``++key=v``, ``~key`` included)."""
    return override.lstrip("+~").split("=", 1)[0]


def reject_moved_keys(overrides: Sequence[str]) -> None:
    """ValueError naming the new key for the first override that uses a moved one."""
    for override in overrides:
        key = override_key(override)
        if key in MOVED_KEYS:
            raise ValueError(f"{key} has moved: use {MOVED_KEYS[key]} (in {override!r})")


def composition_line(error: Exception, overrides: Sequence[str], schema: type) -> str:
    """One line for an error of Hydra's composition: the key, the value given, what it takes.

    Built from the exception's fields (the OmegaConf cause's ``full_key``, the missing
    option's group) and the user's own override, not from Hydra's multi-line text, which
    is kept (first lines, joined) only for errors of no known kind.
    """
    from hydra.errors import MissingConfigException
    from omegaconf import DictConfig
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

    cause = error.__cause__
    if isinstance(error, MissingConfigException) and error.options:
        group, _, option = (error.missing_cfg_file or "").rpartition("/")
        return (f"{group}={option}: config group {group} has no option {option!r}; "
                f"available: {', '.join(error.options)}")
    full_key = getattr(cause, "full_key", None) or ""
    key = full_key.split("[")[0]  # train.optim.betas[0] -> the list's key
    if isinstance(cause, ValidationError) and key:
        try:
            hint = field_type(key, schema)
        except ValueError:  # not a key of the job's schema: Hydra's own config
            hint = None
        if dataclasses.is_dataclass(hint):
            return (f"{_given(key, overrides)}: {key} is a section: set its keys one by one "
                    f"({key}.<key>=value)")
        if hint is not None:
            return f"{_given(key, overrides)}: expected {expected(hint)}"
    unknown_key = isinstance(cause, (ConfigAttributeError, ConfigKeyError))
    if unknown_key and isinstance(cause.parent_node, DictConfig):
        prefix = full_key.rpartition(".")[0]
        prefix = f"{prefix}." if prefix else ""
        return _unknown(full_key, prefix, sorted(str(k) for k in cause.parent_node.keys()))
    if cause is None and getattr(error, "full_key", None):  # e.g. an interpolation's
        lines = [_given(error.full_key, overrides), _first_line(error)]
    else:
        lines = [_first_line(error)] + ([_first_line(cause)] if cause is not None else [])
    return ": ".join(line for line in lines if line)


def _given(key: str, overrides: Sequence[str]) -> str:
    """``key=value`` as the command line gave it (the last override wins, as in Hydra)."""
    values = [o.split("=", 1)[1] for o in overrides if "=" in o and override_key(o) == key]
    return f"{key}={values[-1]}" if values else f"{key} (as conf/ sets it)"


def _first_line(error: BaseException) -> str:
    return next((line.strip() for line in str(error).splitlines() if line.strip()), "")
