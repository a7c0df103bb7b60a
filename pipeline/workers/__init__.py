"""Plain classes that the launcher wraps as Ray actors; tests drive them without Ray."""
