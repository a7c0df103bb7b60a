"""The single-process reference trainer (``trainer.SingleProcessTrainer``): one job put
together in one process, without Ray. It is the driver's peer, so it sits above the job
layer it assembles from, never inside a component package that the job's config imports."""
