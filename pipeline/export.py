"""Export a training checkpoint as a DFlash drafter that SGLang and vLLM load.

    python -m pipeline.export --checkpoint runs/demo/checkpoints/step_00000150 --out drafter/
    python -m pipeline.export --checkpoint runs/demo --out drafter/ --dtype bfloat16  # latest

Writes config.json + model.safetensors (no embedding, no LM head) + modeling_dflash.py, after
checking the tensor set against what loaders expect; see README "Serving". The last line names
the step exported. A step folder that is not usable (torn, corrupt, incomplete) is refused in
one line naming why and the run's newest usable checkpoint, with exit status 2.
"""

import argparse
import json
import logging
import re
import sys
from pathlib import Path
from typing import Optional

from pipeline import checkpoint as ckpt
from pipeline.checkpoint.files import load_state
from pipeline.checkpoint.sharded import LEGACY_FILE, load_weights
from pipeline.job.cli_help import EXPORT_EXAMPLES
from pipeline.runtime.diskfull import DiskFullError
from pipeline.model.config import DrafterSpec
from pipeline.model.drafter import DFlashDrafter
from pipeline.model.serving_format import save_drafter

log = logging.getLogger(__name__)

# A step folder as published (step_N) or as an interrupted write left it (.step_N.tmp-PID).
_STEP_NAME = re.compile(r"^\.?step_\d+")


def pick_checkpoint(path: Path) -> Path:
    """The step folder to export: ``path`` itself, or a run's out_dir's newest usable one
    (each newer unusable one is skipped with a warning). ValueError, in one line, naming why
    a step folder is unusable and the run's newest usable checkpoint, if it has one."""
    if not path.is_dir():
        raise ValueError(f"--checkpoint {path}: no such folder")
    if _is_step_folder(path):
        why = ckpt.problem(path)
        if why is not None:
            raise ValueError(f"--checkpoint {path} is not a usable checkpoint: {why}; "
                             f"{_newest_usable_of_run(path)}")
        return path
    folders = ckpt.step_folders(path)
    if not folders:
        raise ValueError(f"--checkpoint {path}: neither a checkpoint folder nor an out_dir "
                         "with checkpoints/step_*")
    skipped = []
    for folder in reversed(folders):
        why = ckpt.problem(folder)
        if why is None:
            for older, reason in skipped:
                log.warning("skipping checkpoint %s: %s; took the previous one", older, reason)
            return folder
        skipped.append((folder.name, why))
    raise ValueError(f"--checkpoint {path}: none of its {len(folders)} checkpoint(s) is usable "
                     f"(the newest, {skipped[0][0]}: {skipped[0][1]})")


def _is_step_folder(path: Path) -> bool:
    return ((path / "state.json").exists() or path.parent.name == "checkpoints"
            or bool(_STEP_NAME.match(path.name)))


def _newest_usable_of_run(folder: Path) -> str:
    """Where to export from instead: the newest usable step folder of ``folder``'s run."""
    if folder.parent.name != "checkpoints":
        return "it is in no run's checkpoints/ folder"
    run = folder.parent.parent
    usable: Optional[Path] = next((p for p in reversed(ckpt.step_folders(run))
                                   if p.resolve() != folder.resolve() and ckpt.problem(p) is None),
                                  None)
    if usable is None:
        return f"run {run} has no usable checkpoint"
    return f"the newest usable checkpoint of run {run} is {usable}"


def export_checkpoint(checkpoint: Path, out: Path, dtype: str = "bfloat16") -> Path:
    """``checkpoint`` is a step folder, or a run's out_dir (its latest checkpoint)."""
    return _export(pick_checkpoint(checkpoint), out, dtype)


def _export(checkpoint: Path, out: Path, dtype: str) -> Path:
    """Export a step folder :func:`pick_checkpoint` has checked."""
    # Read before anything else of the checkpoint is trusted; runs no code from the files.
    legacy = checkpoint / LEGACY_FILE
    weights = load_state(legacy)["model"] if legacy.is_file() else None
    state = json.loads((checkpoint / "state.json").read_text())
    model = DFlashDrafter.for_loading(DrafterSpec.from_hf_config(state["drafter_config"]), "cpu")
    if weights is not None:
        model.load_state_dict(weights)
    else:
        load_weights(model, checkpoint)
    return save_drafter(model, out, dtype)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.export", description=__doc__.split("\n\n")[0],
        epilog="examples:\n" + "\n".join(f"  {e}" for e in EXPORT_EXAMPLES),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=Path, required=True,
                        help="a step folder (<out_dir>/checkpoints/step_N), or a run's out_dir: "
                             "its newest usable checkpoint")
    parser.add_argument("--out", type=Path, required=True,
                        help="the folder to write: config.json, model.safetensors, "
                             "modeling_dflash.py")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"],
                        help="the weights' dtype in model.safetensors (default: bfloat16)")
    return parser


def main() -> None:
    args = build_parser().parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    try:
        folder = pick_checkpoint(args.checkpoint)
        out = _export(folder, args.out, args.dtype)
    except DiskFullError as e:
        raise SystemExit(f"error: no space left on device: could not write {e.filename}; "
                         f"{args.out} is as it was") from None
    except ValueError as e:  # an unusable checkpoint, or one refused to load: one line
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    log.info("exported step %d (%s) -> %s", ckpt.read_point(folder).step, folder, out)


if __name__ == "__main__":
    main()
