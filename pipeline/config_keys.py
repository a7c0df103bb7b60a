"""Which config keys exist: a key the schema does not know stops the job, however it came in.

Hydra refuses an unknown ``key=value`` against the structured schema, but ``+key=value`` adds
the key anyway, and ``OmegaConf.to_object`` then drops it: ``+train.optim.weight_decy=0.1``
would train with weight_decay 0.0 and no word. :func:`reject_unknown_keys` walks the composed
config against the dataclasses and refuses such a key, naming the section's keys and the
nearest one. Free-form sections (``dict`` fields such as ``logger.wandb_init``) take any key.
"""

from __future__ import annotations

import dataclasses
import difflib
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
    return (f"{name} is not a config key (an override with '+' adds keys, but the schema "
            f"ignores unknown ones): {section} has {known}{hint}")


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
