"""Which node this process runs on, as Ray names it: rings are opened only on their own node."""

from __future__ import annotations

from typing import Optional


def current_node_id() -> Optional[str]:
    """Ray's id of this process's node, or None outside Ray (a plain single-node process)."""
    import ray

    if not ray.is_initialized():
        return None
    return ray.get_runtime_context().get_node_id()
