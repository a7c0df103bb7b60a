"""Training checkpoints, in one place. The face:

- save at a step: :class:`Checkpoints` (``save_async`` behind a step, ``save_now`` when the loop
  has stopped); a save counts once every rank's files are written, verified and its step
  reported, and is then published (renamed into place) atomically;
- load: :func:`find` (``train.checkpoint.resume``: the latest usable checkpoint, or a given
  one, checked file by file against its recorded sha256) and the drafters'
  ``load_checkpoint``, which reshards to the job's world size and mode;
- latest: :func:`latest`, the newest usable checkpoint (newer unusable ones are skipped with a
  warning naming why);
- purge: :func:`purge`, all but the newest ``keep_last`` (done after every publish).

Modules, one concept each: ``folders`` (step folders: staging, publish, verify, latest, purge;
the on-disk format is in its docstring), ``saves`` (the driver's side of saves), ``writer``
(a rank's background save), ``host_copy`` (the snapshot that holds the step loop),
``sharded`` (weights and AdamW state through torch.distributed.checkpoint), ``files`` (durable
writes, hashes and code-free loads), ``point`` and ``cursor`` (where training continues),
``contract`` (the settings a resume must keep), ``convert`` (old drafter.pt checkpoints to the
DCP format, optional: they are read as they are).
"""

from pipeline.checkpoint.folders import latest, prune as purge, resolve_resume as find
from pipeline.checkpoint.saves import CheckpointSaves as Checkpoints

__all__ = ["Checkpoints", "find", "latest", "purge"]
