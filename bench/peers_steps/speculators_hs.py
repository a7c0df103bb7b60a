"""Speculators' offline data from our target, in its documented file format (run in the peers'
environment).

    python -m bench.peers_steps.speculators_hs --dataset DIR --target T --layers 2 15 27 \
        --out DIR/hidden_states --device cuda

Its own generator (``speculators generate-offline-data``) asks a vLLM server for the hidden
states; without one, they are written here as its file backend reads them
(hs_connectors.FileTransfer): one ``hs_{i}.safetensors`` per row i of the dataset its
``prepare-data`` wrote, holding ``token_ids`` [S] and ``hidden_states`` [S, L + 1, H]: the
outputs of the layers it names (its id i is HF's hidden_states[i]) and, last, the final layer's
output before the final norm (vLLM's ``--include-last-layer``; its trainer applies the
verifier's norm to it).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch


@torch.no_grad()
def write(dataset: str, target: str, layers: list[int], out: Path, device: str) -> int:
    from datasets import load_from_disk
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    dtype = torch.bfloat16
    model = AutoModelForCausalLM.from_pretrained(target, dtype=dtype).to(device).eval()
    last = {}
    model.model.norm.register_forward_pre_hook(lambda _m, args: last.update(h=args[0]))
    rows = load_from_disk(dataset).with_format("torch")
    out.mkdir(parents=True, exist_ok=True)
    for i in range(len(rows)):
        ids = rows[i]["input_ids"].to(torch.long)
        hs = model.model(input_ids=ids[None].to(device), output_hidden_states=True).hidden_states
        planes = [hs[j][0] for j in layers] + [last["h"][0]]
        save_file({"token_ids": ids.contiguous(),
                   "hidden_states": torch.stack(planes, dim=1).to(dtype).cpu().contiguous()},
                  str(out / f"hs_{i}.safetensors"))
    return len(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", required=True, help="the folder prepare-data wrote")
    p.add_argument("--target", required=True)
    p.add_argument("--layers", type=int, nargs="+", required=True,
                   help="speculators' aux layer ids (HF hidden_states indices)")
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args(argv)
    n = write(args.dataset, args.target, args.layers, Path(args.out), args.device)
    print(f"wrote {n} hidden-state files to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
