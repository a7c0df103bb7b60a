"""One training job put together: its config (JobConfig), what it resolves to, its data,
its micro-batch assembly, the settings a resume must keep, and its out-of-memory line."""
