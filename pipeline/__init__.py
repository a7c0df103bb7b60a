"""DFlash drafter training over Ray: one process per GPU."""

# First thing in an actor's process, before any module of ours imports torch: full garbage
# collections wait until the actor is built (pipeline/runtime/startup_gc.py says why).
from pipeline.runtime.startup_gc import defer_if_asked as _defer_if_asked

_defer_if_asked()
