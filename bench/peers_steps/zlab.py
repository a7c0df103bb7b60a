"""Every checkpoint as one z-lab-format folder, which the one decoder loads.

z-lab's format (docs: SERVING.md) is config.json + model.safetensors; what
``AutoModel.from_pretrained(..., trust_remote_code=True)`` also needs is a modeling file named
by ``auto_map``: the pipeline's own (pipeline/serving/modeling_dflash.py) is added to each
folder. Then pipeline/serving/layout.py checks the folder as it checks the pipeline's exports
(tensor names and shapes against config.json), so a peer's export that loaders would misread
is named before it is decoded.

- ModelOpt exports z-lab's format itself (its DFlashExporter);
- Speculators saves its own format; its converter goes the other way (z-lab -> speculators,
  ``speculators convert``), so the inverse is written here from what that converter documents:
  the draft body's tensors keep their names, ``transformer_layer_config`` is the Qwen3 config,
  and its aux layer ids are z-lab's plus one (it reads hidden_states[i], z-lab
  hidden_states[i + 1]). tests/bench/test_peers_units.py checks the inverse against its
  converter: z-lab -> speculators (theirs) -> z-lab (this) gives the same folder.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

from pipeline.serving.layout import AUTO_MAP, MODELING_FILE, expected_tensors, verify_export

# Speculators' tensors that come from the verifier at load time, not part of a z-lab draft.
_VERIFIER_TENSORS = ("embed_tokens.weight", "lm_head.weight", "verifier_lm_head.weight",
                     "verifier_norm.weight", "t2d", "d2t")
# Keys of speculators' transformer_layer_config that are not a z-lab draft config's.
_DROP_KEYS = ("auto_map", "architectures", "_name_or_path", "transformers_version")


def finish(folder: Path) -> dict:
    """Make ``folder`` loadable by the decoder (modeling file, auto_map) and check it; returns
    what the result file keeps of it (the draft's parameters, block size, taps)."""
    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = AUTO_MAP
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    shutil.copyfile(MODELING_FILE, folder / MODELING_FILE.name)
    verify_export(folder)
    params = sum(math.prod(map(int, shape)) for shape in expected_tensors(config).values())
    return {"parameters": params, "block_size": config["block_size"],
            "num_layers": config["num_hidden_layers"],
            "target_layer_ids": config["dflash_config"]["target_layer_ids"],
            "mask_token_id": config["dflash_config"]["mask_token_id"]}


def from_speculators(src: Path, dst: Path, num_target_layers: int) -> Path:
    """A speculators DFlash checkpoint (``save_pretrained`` folder) as a z-lab folder."""
    from safetensors.torch import load_file, save_file

    src, dst = Path(src), Path(dst)
    spec = json.loads((src / "config.json").read_text())
    if spec.get("speculators_model_type", "dflash") != "dflash":
        raise ValueError(f"{src}: a {spec.get('speculators_model_type')} checkpoint, not DFlash")
    layer = {k: v for k, v in spec["transformer_layer_config"].items() if k not in _DROP_KEYS}
    aux = [int(i) for i in spec["aux_hidden_state_layer_ids"]]
    config = {**layer, "architectures": ["DFlashDraftModel"], "model_type": "qwen3",
              "block_size": int(spec["block_size"]), "num_target_layers": num_target_layers,
              "dflash_config": {"mask_token_id": int(spec["mask_token_id"]),
                                "target_layer_ids": [i - 1 for i in aux]},
              "tie_word_embeddings": False}
    config.setdefault("layer_types", ["full_attention"] * int(config["num_hidden_layers"]))
    weights = {}
    for path in sorted(src.glob("*.safetensors")):
        weights.update(load_file(str(path)))
    body = {k: v.contiguous() for k, v in weights.items() if k not in _VERIFIER_TENSORS}
    dst.mkdir(parents=True, exist_ok=True)
    save_file(body, str(dst / "model.safetensors"), metadata={"format": "pt"})
    (dst / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return dst


def sliding_window_note(config: dict, longest_context: int) -> str | None:
    """The decoder's layers attend to the whole context; a sliding-window layer agrees with
    that only while every context is within its window. None where that holds."""
    window = config.get("sliding_window")
    kinds = set(config.get("layer_types") or [])
    if "sliding_attention" in kinds and window and longest_context > int(window):
        return (f"sliding-window layers (window {window}) decoded with full attention over "
                f"contexts up to {longest_context} tokens")
    return None
