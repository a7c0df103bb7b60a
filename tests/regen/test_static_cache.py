"""The row cache's prefill write, traced as ``compile_prefill`` traces it: in place, and only
where the prompts go."""

from types import SimpleNamespace

import pytest
import torch
from torch._dynamo.backends.common import aot_autograd

from pipeline.regen.static_cache import RowCache

CONFIG = SimpleNamespace(num_key_value_heads=2, head_dim=4, hidden_size=8, num_attention_heads=2,
                         num_hidden_layers=1)


@pytest.mark.parametrize("token_major", [True, False], ids=["token_major", "head_major"])
def test_a_traced_prefill_writes_its_rows_in_place(token_major):
    """A write through a slice of the buffer (``keys[rows, :width] = ...``) traces to a
    ``slice_scatter``: inductor then copies that slice of every row of the cache out and back,
    each layer. The write must trace without one, and land at the prompts' rows and columns
    only (every other element keeps its sentinel)."""
    cache = RowCache(CONFIG, 5, 16, torch.float32, "cpu", token_major=token_major)
    for buffer in cache.key_buffers + cache.value_buffers:
        buffer.fill_(7.0)
    graphs = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def write(keys, values, rows, columns):
        cache.prefill_rows, cache.prefill_columns = rows, columns
        out = cache.update(keys, values, 0)
        cache.prefill_rows = cache.prefill_columns = None
        return out

    traced = torch.compile(write, backend=aot_autograd(fw_compiler=keep), fullgraph=True,
                           dynamic=True)
    keys, values = torch.randn(2, 2, 3, 4), torch.randn(2, 2, 3, 4)  # [rows, kv, width, d]
    rows = torch.tensor([3, 1])
    with torch.no_grad():
        traced(keys, values, rows, torch.arange(3))
    torch._dynamo.reset()
    ops = {str(n.target) for g in graphs for n in g.graph.nodes if n.op == "call_function"}
    assert "aten.slice_scatter.default" not in ops, sorted(ops)
    for buffer, written in ((cache.key_buffers[0], keys), (cache.value_buffers[0], values)):
        head_major = buffer if not token_major else buffer.transpose(1, 2)
        expected = torch.full_like(head_major, 7.0)
        expected[rows, :, :3] = written
        assert torch.equal(head_major, expected)
