"""Chunked prefill on a real GPU: iosim.gpu.attention_varlen with a batch made with a block table, so k and v are a
paged KV cache (num_pages, page_size, kv_heads, head_dim) read by flash2's paged kernel, against a float64 reference
computed on the host sequence by sequence from the same keys before they were paged.

Every case draws fresh random inputs (seeded by the test's id), pages each sequence's keys into pages drawn at random
from the cache (any order), fills every slot the table does not name for a live key with NaN (a kernel that reads one
fails), and poisons the outputs (test_varlen_gpu's run); the same tiles on the contiguous packed keys must give the
same bits.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_attention_gpu import _cp, seeded_rng
from test_varlen_gpu import BATCHES, DTYPES, GQA, check_varlen, packed

from iosim.launch import varlen as geo

pytestmark = pytest.mark.gpu

# one token; smaller than every tile; not a power of two; a tile (the PageTiles instantiation at every head dim);
# several tiles
PAGE_SIZES = (1, 16, 48, 64, 256)


def paged(rng, dev, lens_k, page_size, spare=3):
    """k and v (total_k, H_kv, d) of packed sequences -> a paged cache with every sequence's pages at random places
    (NaN in every unused slot and spare page) and its block table (batch, max_pages), unused entries -1."""
    cp = _cp()
    k, v = dev[1], dev[2]
    used = [-(-n // page_size) for n in lens_k]
    max_pages = max(1, max(used))
    num_pages = sum(used) + spare
    order = rng.permutation(num_pages)
    table = np.full((len(lens_k), max_pages), -1, dtype=np.int32)
    kc = cp.full((num_pages, page_size, *k.shape[1:]), np.nan, dtype=cp.float32).astype(k.dtype)
    vc = kc.copy()
    start, nxt = 0, 0
    for b, n in enumerate(lens_k):
        for p in range(used[b]):
            page, rows = int(order[nxt]), slice(start + p * page_size, start + min(n, (p + 1) * page_size))
            nxt += 1
            table[b, p] = page
            kc[page, : rows.stop - rows.start] = k[rows]
            vc[page, : rows.stop - rows.start] = v[rows]
        start += n
    return kc, vc, table


def run_paged(dev, cu, table, page_size, **kw):
    """attention_varlen on the paged cache into NaN-poisoned outputs; host float64 O, lse."""
    from iosim import gpu

    cp = _cp()
    q, kc, vc = dev
    out = cp.full(q.shape, np.nan, dtype=np.float32).astype(q.dtype)
    lse_out = cp.full((q.shape[1], q.shape[0]), np.nan, dtype=cp.float32)
    batch = gpu.varlen_batch(*cu, block_table=table, page_size=page_size)
    got = gpu.attention_varlen(q, kc, vc, batch, options=gpu.AttentionOptions(out=out, lse_out=lse_out), **kw)
    assert got.o is out and got.lse is lse_out
    rec = gpu.last_launch()
    assert rec.page_size == page_size and "true>" in rec.launches[0].kernel
    # pages a multiple of the K/V tile run the PageTiles instantiation (its ninth template argument) at d <= 128
    args = rec.launches[0].kernel.split("<", 1)[1].rstrip(">").split(", ")
    assert (args[8:] == ["true"]) == (page_size % rec.tiles["block_kv"] == 0 and rec.head_dim <= 128), args
    cp.cuda.runtime.deviceSynchronize()
    return cp.asnumpy(out).astype(np.float64), cp.asnumpy(lse_out).astype(np.float64)


@pytest.mark.parametrize("page_size", PAGE_SIZES)
@pytest.mark.parametrize("batch", BATCHES, ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_chunked_prefill_on_a_paged_cache_equals_float64_reference(page_size, batch, causal, dtype):
    rng = seeded_rng()
    lens_q, lens_k = BATCHES[batch]
    host, dev, cu = packed(rng, lens_q, lens_k, GQA["4:1"], 128, dtype)
    kc, vc, table = paged(rng, dev, lens_k, page_size)
    o, lse = run_paged((dev[0], kc, vc), cu, table, page_size, causal=causal)
    check_varlen(host, lens_q, o, lse, dtype, causal, None, f"paged {page_size} {batch} causal={causal}")


@pytest.mark.parametrize("d", sorted(geo.FLASH_PAGED_TILES))
@pytest.mark.parametrize("page_size", (16, 32, 64))  # 32: half a tile but at d = 256 (Bc 32, no PageTiles)
@pytest.mark.parametrize("gqa", GQA)
def test_every_head_dim_of_the_paged_kernel_equals_float64_reference(d, page_size, gqa):
    rng = seeded_rng()
    lens_q, lens_k = [1, 77, 300], [40, 77, 333]
    host, dev, cu = packed(rng, lens_q, lens_k, GQA[gqa], d, "bfloat16")
    kc, vc, table = paged(rng, dev, lens_k, page_size)
    o, lse = run_paged((dev[0], kc, vc), cu, table, page_size, causal=True)
    check_varlen(host, lens_q, o, lse, "bfloat16", True, None, f"paged d={d} page {page_size} {gqa}")


@pytest.mark.parametrize("window", [(0, 0), (31, 0), (256, 0), (100, 50)], ids=str)
@pytest.mark.parametrize("page_size", (16, 64))
@pytest.mark.parametrize("d", (64, 128))
def test_a_sliding_window_on_a_paged_cache_equals_float64_reference(window, page_size, d):
    rng = seeded_rng()
    lens_q, lens_k = BATCHES["chunked"]
    causal = window[1] == 0
    host, dev, cu = packed(rng, lens_q, lens_k, GQA["4:1"], d, "float16")
    kc, vc, table = paged(rng, dev, lens_k, page_size)
    o, lse = run_paged((dev[0], kc, vc), cu, table, page_size, causal=causal, window=window)
    check_varlen(host, lens_q, o, lse, "float16", causal, window, f"paged {page_size} window={window} d={d}")


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("page_size", (16, 48, 64, 128))
def test_the_paged_kernel_gives_the_contiguous_kernels_bits_on_the_same_tiles(causal, page_size):
    from iosim import gpu

    cp, rng = _cp(), seeded_rng()
    lens_q, lens_k = [7, 128, 500], [300, 128, 1100]
    _, dev, cu = packed(rng, lens_q, lens_k, GQA["4:1"], 128, "bfloat16")
    kc, vc, table = paged(rng, dev, lens_k, page_size)
    bq, bkv = geo.FLASH_PAGED_TILES[128]
    o, lse = run_paged((dev[0], kc, vc), cu, table, page_size, causal=causal)
    flat = gpu.attention_varlen(*dev, gpu.varlen_batch(*cu), causal=causal,
                                options=gpu.AttentionOptions(block_q=bq, block_kv=bkv))
    assert np.array_equal(o, cp.asnumpy(flat.o).astype(np.float64))
    assert np.array_equal(lse, cp.asnumpy(flat.lse).astype(np.float64))


def test_a_paged_batch_is_checked_against_the_cache_with_one_clear_error():
    from iosim import gpu

    cp, rng = _cp(), seeded_rng()
    lens_q, lens_k = [5, 9], [40, 70]
    _, dev, cu = packed(rng, lens_q, lens_k, GQA["4:1"], 64, "bfloat16")
    kc, vc, table = paged(rng, dev, lens_k, 16, spare=0)
    batch = gpu.varlen_batch(*cu, block_table=table, page_size=16)
    with pytest.raises(gpu.AttentionInputError, match="names page"):
        gpu.attention_varlen(dev[0], kc[:-1], vc[:-1], batch)
    with pytest.raises(gpu.AttentionInputError, match="pages of 16 tokens"):
        gpu.attention_varlen(dev[0], kc, vc, gpu.varlen_batch(*cu, block_table=table, page_size=32))
    with pytest.raises(gpu.AttentionInputError, match="schedule='flash3'"):
        gpu.attention_varlen(dev[0], kc, vc, batch, schedule="flash3")
    with pytest.raises(gpu.AttentionInputError, match="4 dims"):
        gpu.attention_varlen(*dev, batch)
    with pytest.raises(gpu.AttentionInputError, match="block_table"):
        gpu.varlen_batch(*cu, block_table=cp.asarray(table[:, :2]), page_size=16)  # 70 keys need 5 pages


@pytest.mark.parametrize("seed", [None, 3])
def test_paged_kv_puts_every_key_where_its_table_says_and_zeros_elsewhere(seed):
    from iosim import gpu

    cp, rng = _cp(), seeded_rng()
    lens = [0, 1, 47, 48, 130]
    cu = np.concatenate([[0], np.cumsum(lens)])
    k = cp.asarray(rng.standard_normal((cu[-1], 2, 64)).astype(np.float32)).astype(cp.float16)
    kc, vc, table = gpu.paged_kv(k, -k, cu, 48, seed=seed)
    assert kc.shape == (sum(-(-n // 48) for n in lens), 48, 2, 64) and table.shape == (5, 3)
    got, want = cp.asnumpy(kc), cp.asnumpy(k)
    filled = np.zeros(kc.shape[:2], dtype=bool)
    for b, n in enumerate(lens):
        for t in range(n):
            page, slot = table[b, t // 48], t % 48
            assert np.array_equal(got[page, slot], want[cu[b] + t]), (b, t)
            filled[page, slot] = True
    assert not got[~filled].any()
    assert np.array_equal(cp.asnumpy(vc), -got)
    assert (seed is None) == (table[4].tolist() == [3, 4, 5])  # sequence order, or drawn at random
