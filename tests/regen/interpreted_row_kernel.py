"""The ``triton`` decode attention's kernel run by Triton's interpreter on CPU, in fp32.

    TRITON_INTERPRET=1 python -m tests.regen.interpreted_row_kernel

Run in a process of its own by tests/regen/test_row_kernel.py: the interpreter is chosen when
``triton.jit`` decorates the kernel, i.e. when pipeline.regen.row_kernel is first imported.
Prints one JSON line: the kernel's largest error against fp32 attention row by row per case, whether
slots past each row's length and other rows' caches leave a row's output unchanged, and
whether the static engine on the ``triton`` step answers as generate does.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

import torch

CASES = (  # rows, heads, kv_heads, head_dim, capacity
    (3, 8, 2, 16, 80),     # a group of 4 (Qwen3-8B's), lengths across a 64-slot block
    (2, 9, 3, 64, 150),    # SmolLM2's group of 3 and head_dim 64, three blocks
    (2, 4, 4, 24, 70),     # no grouping, a head_dim that is no power of two
)


def kernel_cases() -> list[dict]:
    from pipeline.regen.row_kernel import rows_decode
    from tests.gpu.test_static_decoder_gpu import _attention_by_rows

    g = torch.Generator().manual_seed(0)
    found = []
    for rows, heads, kv_heads, dim, capacity in CASES:
        # The query a strided view, as the attention hands it over ([b, heads, 1, d][:, :, 0]).
        query = torch.randn(rows, heads, 1, dim + 8, generator=g)[:, :, 0, :dim]
        keys = torch.randn(rows, capacity, kv_heads, dim, generator=g)
        values = torch.randn(rows, capacity, kv_heads, dim, generator=g)
        lengths = torch.randint(2, capacity, (rows,), generator=g, dtype=torch.int32)
        lengths[0], lengths[-1] = 1, capacity  # one slot, and the whole row
        scale = dim ** -0.5
        got = rows_decode(query, keys, values, lengths, scale)
        want = _attention_by_rows(query[:, :, None], keys, values, lengths, heads // kv_heads)
        error = (got - want).abs().max()
        # Perturbation: what lies past a row's length, and the other rows, must not count.
        changed_k, changed_v = keys.clone(), values.clone()
        for r in range(rows):
            changed_k[r, int(lengths[r]):] = 1e4
            changed_v[r, int(lengths[r]):] = -1e4
        past = rows_decode(query, changed_k, changed_v, lengths, scale)
        solo = torch.stack([rows_decode(query[r:r + 1], keys[r:r + 1], values[r:r + 1],
                                        lengths[r:r + 1], scale)[0] for r in range(rows)])
        found.append({"case": [rows, heads, kv_heads, dim, capacity],
                      "max_error": float(error),
                      "past_length_ignored": bool(torch.equal(past, got)),
                      "rows_apart_equal": bool(torch.equal(solo, got))})
    return found


def engine_equals_generate() -> dict:
    from pipeline.regen.static_engine import greedy_decode
    from tests.regen.test_static_decoder import (MAX_NEW, _load, _prompts, _reference, _save,
                                                 _stops_for)

    found = {}
    for family in ("qwen3", "llama"):
        model = _load(_save(tempfile.mkdtemp(), family))
        prompts = _prompts(6, seed=7)
        stops = _stops_for(model, prompts)
        got = greedy_decode(model, prompts, MAX_NEW, stops, batch_size=3, cuda_graphs=False,
                            attention="triton", sync_every=2)
        found[family] = got == _reference(model, prompts, stops)
    return found


def main() -> int:
    if os.environ.get("TRITON_INTERPRET") != "1":
        print("set TRITON_INTERPRET=1: this runs the kernel through Triton's interpreter",
              file=sys.stderr)
        return 2
    from pipeline.regen import static_attention

    # The decode steps' attention calls the kernel took (an engine that fell back to varlen's
    # SDPA form would equal generate too).
    served = []
    serves = static_attention._triton_kernel_serves

    def counted(query):
        served.append(serves(query))
        return served[-1]

    static_attention._triton_kernel_serves = counted
    result = {"kernel": kernel_cases(), "engine_equals_generate": engine_equals_generate(),
              "decode_calls": len(served), "decode_calls_to_the_kernel": sum(served)}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
