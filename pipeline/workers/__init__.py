"""Plain classes that pipeline.runtime.ray_start.start_actor wraps as Ray actors; tests drive them
without Ray."""
