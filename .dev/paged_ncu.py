"""ncu helper: contiguous vs paged (pages of 16 and 64) on the bench's chunked-prefill batch, one call each."""
import sys
sys.path.insert(0, "benchmarks")
import torch, cupy as cp
from bench_varlen import PAGED_BATCH, packed_inputs
from iosim import gpu
from iosim.launch import varlen as geo
for d in (128, 64):
    chunks, cache = PAGED_BATCH["chunks"], PAGED_BATCH["cache"]
    H = 2048 // d; Hk = H // 4
    q, _, _, cu_q = packed_inputs(torch, chunks, H, Hk, d, seed=d)
    _, k, v, cu_k = packed_inputs(torch, cache, H, Hk, d, seed=d + 1)
    bq, bkv = geo.FLASH_PAGED_TILES[d]
    flat = gpu.varlen_batch(cu_q, cu_k)
    gpu.attention_varlen(q, k, v, flat, causal=True, options=gpu.AttentionOptions(block_q=bq, block_kv=bkv))
    for page in (16, 64):
        kc, vc, table = gpu.paged_kv(k, v, cu_k, page, seed=page)
        gpu.attention_varlen(q, kc, vc, gpu.varlen_batch(cu_q, cu_k, block_table=table, page_size=page), causal=True)
    torch.cuda.synchronize()
