"""Training checkpoints, in one place. The face the driver and the tools use:

- save at a step: :class:`CheckpointSaves` (``save_async`` right behind a step, ``save_now``
  when the loop has stopped); a save counts once every rank's files are written, recorded
  (size, sha256) and its step reported, and is then published (renamed into place) at once;
- load: :func:`resolve_resume` (``train.checkpoint.resume``: the latest usable checkpoint, or
  a given one, checked file by file against its recorded sha256), :func:`read_point` and
  :func:`read_state`; the drafters' ``load_checkpoint`` (pipeline/workers/drafter_worker.py)
  reads the files, resharding to the job's world size and mode;
- latest: :func:`latest`, the newest usable checkpoint (each newer unusable one is skipped
  with a warning naming why);
- purge: :func:`prune`, all but the newest ``keep_last`` (run after every publish),
  :func:`clean_stale`, what an interrupted write left, and :func:`discard_unfinished`, what
  the job's own unfinished writes leave when it stops early (Ctrl-C, SIGTERM).

Modules, one concept each: ``folders`` (step folders: staging, publish, verify, latest,
purge; the on-disk format is in its docstring), ``saves`` (the driver's side of saves),
``writer`` (a rank's background save), ``host_copy`` (the snapshot, the one part of a save
that holds the step loop), ``sharded`` (weights and AdamW state through
torch.distributed.checkpoint, and checkpoints written before it), ``files`` (durable writes,
hashes, code-free loads), ``point`` and ``cursor`` (where training continues). The settings
a resume must keep are read from the JobConfig, so they live in the job layer, in
pipeline/job/resume_contract.py.
"""

from pipeline.checkpoint.folders import (clean_stale, discard_unfinished, latest, problem, prune,
                                         read_point, read_state, resolve_resume, step_folders)
from pipeline.checkpoint.saves import CheckpointSaves

__all__ = ["CheckpointSaves", "clean_stale", "discard_unfinished", "latest", "problem", "prune",
           "read_point", "read_state", "resolve_resume", "step_folders"]
