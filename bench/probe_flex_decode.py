"""Where the flex decode step leaves generate on CUDA: the probe behind its refusal there.

    python -m bench.probe_flex_decode            # CUDA; on CPU every row is equal

The tiny Llama of tests/gpu/test_static_decoder_gpu.py, fp32, three calls on one engine and on
a fresh engine per call, for each decode-step attention; prints, per call, the rows whose answer
differs from HF generate and the first differing output index. On an H200 (2026-12-03) flex
differed for rows 2, 3 and 6, each where it crossed column 32 (row 2 at output 9 of a 23-token
prompt, rows 3 and 6 at output 1 of 31- and 32-token prompts), with the full-block index list
an expanded view; it is materialised since.
"""

from __future__ import annotations

import pathlib
import tempfile

import torch
from transformers import AutoModelForCausalLM

from pipeline.regen.static_engine import StaticEngine
from tests.gpu.test_static_decoder_gpu import MAX_NEW, _generate, _tiny_llama


def _first_diff(got: list[int], want: list[int]) -> int:
    return next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))


def main() -> int:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(_tiny_llama(pathlib.Path(tempfile.mkdtemp())),
                                                 dtype=torch.float32).to(device).eval()
    model.generation_config.eos_token_id = None
    g = torch.Generator().manual_seed(5)
    first = [torch.randint(0, 96, (n,), generator=g).tolist()
             for n in torch.randint(1, 40, (8,), generator=g).tolist()]
    first.append([i % 96 for i in range(39)])
    second = [p[:12] for p in first[:4]]
    with torch.no_grad():
        free = [_generate(model, p, set()) for p in first]
    calls = [(first, {free[0][3]}, MAX_NEW), (second, {free[1][5], free[2][2]}, 7),
             (first, {free[0][3]}, MAX_NEW)]
    print(f"device {device}, prompt lengths {[len(p) for p in first]}")
    for fresh in (False, True):
        for attention in ("sdpa", "matmul", "flex"):
            engine = StaticEngine(model, 4, sync_every=3, span_bucket=16, attention=attention)
            for i, (prompts, stops, max_new) in enumerate(calls):
                if fresh:
                    engine = StaticEngine(model, 4, sync_every=3, span_bucket=16,
                                          attention=attention)
                with torch.no_grad():
                    want = [_generate(model, p, stops, max_new) for p in prompts]
                    got = engine.decode(prompts, max_new, stops)
                bad = [(row, _first_diff(x, y)) for row, (x, y) in enumerate(zip(got, want))
                       if x != y]
                print(f"fresh engine per call={fresh} {attention} call {i}: "
                      f"{len(want) - len(bad)}/{len(want)} equal; (row, first index) {bad}",
                      flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
