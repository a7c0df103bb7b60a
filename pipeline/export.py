"""Export a training checkpoint as a DFlash drafter that SGLang and vLLM load.

    python -m pipeline.export --checkpoint runs/demo/checkpoints/step_00000150 --out drafter/
    python -m pipeline.export --checkpoint runs/demo --out drafter/ --dtype bfloat16  # latest

Writes config.json + model.safetensors (no embedding, no LM head) + modeling_dflash.py, after
checking the tensor set against what loaders expect; see README "Serving".
"""

import argparse
import json
import logging
from pathlib import Path

from pipeline import checkpoint as ckpt
from pipeline.checkpoint.files import load_state
from pipeline.checkpoint.sharded import LEGACY_FILE, load_weights
from pipeline.diskfull import DiskFullError
from pipeline.model.config import DrafterSpec
from pipeline.model.drafter import DFlashDrafter
from pipeline.model.serving_format import save_drafter

log = logging.getLogger(__name__)


def export_checkpoint(checkpoint: Path, out: Path, dtype: str = "bfloat16") -> Path:
    """``checkpoint`` is a step folder, or a run's out_dir (its latest checkpoint)."""
    if not (checkpoint / "state.json").exists():
        found = ckpt.latest(checkpoint)
        if found is None:
            raise ValueError(f"--checkpoint {checkpoint}: neither a checkpoint folder nor an "
                             "out_dir with checkpoints/step_*")
        checkpoint = found
    why = ckpt.problem(checkpoint)
    if why is not None:
        raise ValueError(f"--checkpoint {checkpoint}: not a usable checkpoint: {why}")
    # Read before anything else of the checkpoint is trusted; runs no code from the files.
    legacy = checkpoint / LEGACY_FILE
    weights = load_state(legacy)["model"] if legacy.is_file() else None
    state = json.loads((checkpoint / "state.json").read_text())
    model = DFlashDrafter(DrafterSpec.from_hf_config(state["drafter_config"]))
    if weights is not None:
        model.load_state_dict(weights)
    else:
        load_weights(model, checkpoint)
    return save_drafter(model, out, dtype)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    try:
        out = export_checkpoint(args.checkpoint, args.out, args.dtype)
    except DiskFullError as e:
        raise SystemExit(f"error: no space left on device: could not write {e.filename}; "
                         f"{args.out} is as it was") from None
    log.info("exported %s -> %s", args.checkpoint, out)


if __name__ == "__main__":
    main()
