"""The BlockMask built from anchors equals the one create_block_mask evaluates element-wise."""

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask

from pipeline.objective.masks import dense_mask, flex_mask, make_mask_mod


def random_anchors(n, num_anchors, context_len, seed):
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        k = int(torch.randint(num_anchors // 2, num_anchors + 1, (), generator=g))
        picked = torch.randperm(context_len - 1, generator=g)[:k].sort().values
        rows.append(torch.cat([picked, torch.zeros(num_anchors - k, dtype=torch.long)]))
    return torch.stack(rows)  # sorted anchors, then padding at position 0 (as sampled)


def tile_sets(mask):
    """Per (sample, query tile): the set of partial and of full key tiles."""
    out = []
    for counts, idx in ((mask.kv_num_blocks, mask.kv_indices),
                        (mask.full_kv_num_blocks, mask.full_kv_indices)):
        n, _, q_tiles = counts.shape
        out.append([[sorted(idx[b, 0, i, :counts[b, 0, i]].tolist()) for i in range(q_tiles)]
                    for b in range(n)])
    return out


@pytest.mark.parametrize("n,num_anchors,context_len,block_size", [
    (2, 24, 300, 16),   # context not a multiple of the tile
    (2, 64, 800, 16),   # shape A in miniature: many full context tiles
    (3, 17, 129, 8),    # a query tile that is only partly filled
    (2, 40, 256, 10),   # blocks straddle tiles
    (1, 8, 1000, 16),   # few anchors, long context
])
def test_anchor_built_block_mask_matches_create_block_mask(n, num_anchors, context_len,
                                                           block_size):
    anchors = random_anchors(n, num_anchors, context_len, seed=num_anchors)
    q_len = num_anchors * block_size
    ours = flex_mask(anchors, context_len, block_size)
    ref = create_block_mask(make_mask_mod(anchors, context_len, block_size), n, None, q_len,
                            context_len + q_len, device="cpu")
    assert tile_sets(ours) == tile_sets(ref)
    assert ours.seq_lengths == ref.seq_lengths


def test_full_tiles_are_truly_full_and_skipped_tiles_truly_empty():
    """Checked against the element-wise mask, independently of create_block_mask."""
    anchors = random_anchors(2, 48, 700, seed=5)
    mask = flex_mask(anchors, 700, 16)
    dense = dense_mask(anchors, 700, 16)[:, 0]  # [N, Q, K]
    partial, full = tile_sets(mask)
    tile = 128
    for b in range(2):
        for i, (p_tiles, f_tiles) in enumerate(zip(partial[b], full[b])):
            rows = dense[b, i * tile:(i + 1) * tile]
            for t in range(mask.kv_indices.shape[-1]):
                cells = rows[:, t * tile:(t + 1) * tile]
                if t in f_tiles:
                    assert cells.all()
                elif t not in p_tiles:
                    assert not cells.any()


def packed_anchors(docs, row_len, pool, seed):
    """A pool of anchors over ``docs`` packed rows of ``row_len``, and each one's doc start."""
    g = torch.Generator().manual_seed(seed)
    positions, starts = torch.zeros(1, pool, dtype=torch.long), torch.zeros(1, pool,
                                                                             dtype=torch.long)
    k = 0
    for d in range(docs):
        count = int(torch.randint(1, pool // docs + 1, (), generator=g))
        picked = torch.randperm(row_len - 1, generator=g)[:count].sort().values
        positions[0, k:k + count] = picked + d * row_len
        starts[0, k:k + count] = d * row_len
        k += count
    positions[0, k:], starts[0, k:] = positions[0, k - 1], starts[0, k - 1]
    return positions, starts  # the pool's tail repeats its last anchor (as packing.py pads)


@pytest.mark.parametrize("docs,row_len,pool,block_size", [
    (4, 200, 64, 16),   # documents not aligned to tiles
    (3, 256, 40, 8),    # aligned documents, a partly filled query tile
    (12, 64, 96, 16),   # many short documents per query tile
])
def test_packed_block_mask_matches_create_block_mask(docs, row_len, pool, block_size):
    positions, starts = packed_anchors(docs, row_len, pool, seed=docs)
    context_len, q_len = docs * row_len, pool * block_size
    ours = flex_mask(positions, context_len, block_size, starts=starts)
    ref = create_block_mask(make_mask_mod(positions, context_len, block_size, starts), 1, None,
                            q_len, context_len + q_len, device="cpu")
    assert tile_sets(ours) == tile_sets(ref)
    # No block token sees a context position of another document (the element-wise mask).
    dense = dense_mask(positions, context_len, block_size, starts)[0, 0, :, :context_len]
    doc_of_query = (starts // row_len).repeat_interleave(block_size, dim=1)[0]
    doc_of_key = torch.arange(context_len) // row_len
    assert not (dense & (doc_of_query[:, None] != doc_of_key[None])).any()
    assert dense.any()
