"""The flex decode step's block mask: which key blocks a row reads, and which it skips.

Flex attention on CPU applies only the mask function and reads every block, so the decoder's
equality with ``generate`` cannot see a wrong block list; on CUDA a block left out is never
read. The block lists are checked here against each row's filled prefix."""

import pytest
import torch

from pipeline.regen.static_attention import decode_block_mask


def test_rows_read_their_filled_blocks_only():
    positions = torch.tensor([0, 15, 16, 17, 40, 47, 31])
    span = 48  # blocks of 16: gcd(48, 128)
    mask = decode_block_mask(positions, span)
    assert mask.BLOCK_SIZE[1] == 16
    want_read = [[int(b * 16 <= p) for b in range(3)] for p in positions.tolist()]
    assert mask.to_dense()[:, 0, 0].tolist() == want_read
    # Wholly filled blocks need no mask function; the block holding the position does.
    assert mask.full_kv_num_blocks[:, 0, 0].tolist() == [(p + 1) // 16 for p in positions.tolist()]
    assert mask.kv_num_blocks[:, 0, 0].tolist() == [int((p + 1) % 16 > 0) for p in positions.tolist()]
    b, kv = torch.meshgrid(torch.arange(len(positions)), torch.arange(span), indexing="ij")
    zero = torch.zeros_like(b)
    assert torch.equal(mask.mask_mod(b, zero, zero, kv), kv <= positions[:, None])


def test_index_lists_are_laid_out_as_the_cuda_kernel_reads_them():
    """Flex's CUDA kernels read every index and count tensor as a contiguous
    [rows, heads, q blocks, kv blocks] array: a view of stride 0 across rows (what an expand
    gives) would send every row but the first past the list. Found on an H200 (2026-12-03)."""
    mask = decode_block_mask(torch.tensor([31, 15, 40, 47]), 48)
    for name in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices"):
        tensor = getattr(mask, name)
        assert tensor.is_contiguous() and 0 not in tensor.stride(), name
    assert mask.full_kv_indices[:, 0, 0].tolist() == [[0, 1, 2]] * 4


def test_block_size_divides_the_span():
    for span, block in ((128, 128), (256, 128), (784, 16), (96, 32)):
        mask = decode_block_mask(torch.tensor([span - 1, 0]), span)
        assert mask.BLOCK_SIZE[1] == block
        assert mask.to_dense()[0, 0, 0].tolist() == [1] * (span // block)


def test_varlen_on_cuda_is_refused_where_its_kernel_cannot_run(monkeypatch):
    """fp32 on CUDA, or a torch whose flash kernel takes no per-row key lengths: one line
    naming why; CPU always runs its SDPA form."""
    import pipeline.regen.static_attention as sa

    cuda = torch.device("cuda", 0)
    with pytest.raises(ValueError, match=r"^attention=varlen on CUDA needs a bf16 or fp16"):
        sa.check_attention("varlen", cuda, torch.float32)
    monkeypatch.setattr(sa, "_has_seqused_k", lambda: False)
    with pytest.raises(ValueError, match=r"^attention=varlen: torch .* no flash kernel"):
        sa.check_attention("varlen", cuda, torch.bfloat16)
    sa.check_attention("varlen", torch.device("cpu"), torch.float32)
    sa.check_attention("sdpa", cuda, torch.float32)


def test_triton_on_cuda_is_refused_where_its_kernel_cannot_be_built(monkeypatch):
    """No Triton (or a kernel module that fails to import): one line naming why and what to
    use instead; CPU runs varlen's SDPA form."""
    import pipeline.regen.static_attention as sa

    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(sa, "_triton_missing", lambda: "ModuleNotFoundError: no triton")
    with pytest.raises(ValueError, match=r"^attention=triton: its kernel cannot be built "
                                         r"\(ModuleNotFoundError: no triton\): use varlen$"):
        sa.check_attention("triton", cuda, torch.bfloat16)
    sa.check_attention("triton", torch.device("cpu"), torch.float32)


def test_an_engine_whose_kernel_does_not_run_here_says_so(monkeypatch, caplog):
    """varlen and triton off CUDA decode through varlen's SDPA form: one line says so when the
    engine is built (triton's kernel does run on CPU under Triton's interpreter, in fp32)."""
    import pipeline.regen.static_attention as sa

    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert sa.stand_in("varlen", cpu, torch.float32).startswith("attention=varlen: its flash")
    assert sa.stand_in("triton", cpu, torch.float32).startswith("attention=triton: its kernel")
    assert sa.stand_in("varlen", cuda, torch.bfloat16) is None
    assert sa.stand_in("triton", cuda, torch.float32) is None
    assert sa.stand_in("sdpa", cpu, torch.float32) is None
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert sa.stand_in("triton", cpu, torch.float32) is None
    assert sa.stand_in("triton", cpu, torch.bfloat16) is not None
    monkeypatch.delenv("TRITON_INTERPRET")

    from transformers import LlamaConfig, LlamaForCausalLM

    from pipeline.regen.static_engine import StaticEngine

    model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2,
                                         num_key_value_heads=1))
    with caplog.at_level("INFO", logger="pipeline.regen.static_engine"):
        StaticEngine(model, 2, attention="triton")
        StaticEngine(model, 2, attention="sdpa")
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["static decoder: " + sa.stand_in("triton", cpu, torch.float32)]


def test_auto_picks_triton_then_varlen_only_where_their_kernels_run(monkeypatch):
    """auto on CUDA (Ampere or newer) in bf16/fp16: triton where Triton builds its kernel,
    else varlen where a seqused_k flash kernel exists, else sdpa; sdpa on CPU, in fp32 and
    before Ampere; a named attention is kept as it is."""
    import pipeline.regen.static_attention as sa

    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    monkeypatch.setattr(sa, "_has_seqused_k", lambda: True)
    monkeypatch.setattr(sa, "_triton_missing", lambda: None)
    monkeypatch.setattr(sa, "_capability", lambda device: (9, 0))
    assert sa.resolve_attention("auto", cuda, torch.bfloat16) == "triton"
    assert sa.resolve_attention("auto", cuda, torch.float16) == "triton"
    assert sa.resolve_attention("auto", cuda, torch.float32) == "sdpa"
    assert sa.resolve_attention("auto", cpu, torch.bfloat16) == "sdpa"
    assert sa.resolve_attention("auto", cpu, torch.float32) == "sdpa"
    assert sa.resolve_attention("flex", cuda, torch.float32) == "flex"
    monkeypatch.setattr(sa, "_triton_missing", lambda: "ImportError: no module named triton")
    assert sa.resolve_attention("auto", cuda, torch.bfloat16) == "varlen"
    assert sa.resolve_attention("auto", cuda, torch.float16) == "varlen"
    monkeypatch.setattr(sa, "_has_seqused_k", lambda: False)
    assert sa.resolve_attention("auto", cuda, torch.bfloat16) == "sdpa"
    # Before Ampere (a V100, a T4) the flash kernel does not run: sdpa, whatever is installed.
    monkeypatch.setattr(sa, "_has_seqused_k", lambda: True)
    monkeypatch.setattr(sa, "_triton_missing", lambda: None)
    monkeypatch.setattr(sa, "_capability", lambda device: (7, 5))
    assert sa.resolve_attention("auto", cuda, torch.bfloat16) == "sdpa"
    assert sa.resolve_attention("varlen", cuda, torch.bfloat16) == "varlen"  # named: kept


def test_varlen_folds_each_query_group_into_one_kernel_sequence(monkeypatch):
    """The kernel call's layout (each row's query group as that row's queries, one head per kv
    head, keys read to each row's length) against the SDPA form, with the kernel's contract
    written out in Python: the same output for every head of every row."""
    import pipeline.regen.static_attention as sa

    def kernel(q, k, v, q_starts, k_starts, max_q, max_k, scale, k_lengths):
        out = torch.empty_like(q)
        for i, n in enumerate(k_lengths.tolist()):
            qs = slice(int(q_starts[i]), int(q_starts[i + 1]))
            keys = k[int(k_starts[i]):int(k_starts[i]) + n]  # [n, heads, d]
            scores = torch.einsum("qhd,nhd->hqn", q[qs], keys) * scale
            out[qs] = torch.einsum("hqn,nhd->qhd", scores.softmax(-1), v[int(k_starts[i]):int(k_starts[i]) + n])
        return out

    g = torch.Generator().manual_seed(1)
    rows, capacity, kv_heads, group, dim = 4, 24, 2, 3, 8
    q = torch.randn(rows, kv_heads * group, 1, dim, generator=g)
    k = torch.randn(rows, capacity, kv_heads, dim, generator=g)
    v = torch.randn(rows, capacity, kv_heads, dim, generator=g)
    lengths = torch.tensor([1, 9, 23, 24], dtype=torch.int32).view(-1, 1, 1, 1)
    want, _ = sa.row_attention_varlen(None, q, k, v, lengths)
    monkeypatch.setattr(sa, "_varlen_kernel_serves", lambda query: True)
    monkeypatch.setattr(sa, "_varlen_kernel", kernel)
    got, _ = sa.row_attention_varlen(None, q, k, v, lengths)
    assert got.shape == want.shape == (rows, 1, kv_heads * group, dim)
    assert torch.allclose(got, want, atol=1e-5)
