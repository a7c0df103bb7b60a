"""How the values of a call every drafter rank answered become the group's one value, run by
the small Ray task that joins them (pipeline/driver/drafter_group.py, ``RayCalls.join``).

A module of its own that imports nothing: the task's worker imports the functions it runs by
module, and here that costs Ray's own start-up (about half a CPU-second), where the group's
module would add torch (about two).
"""

from __future__ import annotations

from typing import Any, Callable

OWNER_RANK = 0  # the rank that writes the files; its value is the group's


def collected(collect: Callable[[list[Any]], Any], *values: Any) -> Any:
    return collect(list(values))


def only_value(values: list[Any]) -> Any:
    return values[0]


def owner_value(values: list[Any]) -> Any:
    return values[OWNER_RANK]
