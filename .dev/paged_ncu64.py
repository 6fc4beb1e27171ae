"""ncu helper: d = 64 contiguous vs paged 64 on the bench's chunked-prefill batch."""
import sys
sys.path.insert(0, "benchmarks")
import torch
from bench_varlen import PAGED_BATCH, packed_inputs
from iosim import gpu
from iosim.launch import varlen as geo
d = int(sys.argv[1]) if len(sys.argv) > 1 else 64
chunks, cache = PAGED_BATCH["chunks"], PAGED_BATCH["cache"]
H = 2048 // d; Hk = H // 4
q, _, _, cu_q = packed_inputs(torch, chunks, H, Hk, d, seed=d)
_, k, v, cu_k = packed_inputs(torch, cache, H, Hk, d, seed=d + 1)
bq, bkv = geo.FLASH_PAGED_TILES[d]
gpu.attention_varlen(q, k, v, gpu.varlen_batch(cu_q, cu_k), causal=True, options=gpu.AttentionOptions(block_q=bq, block_kv=bkv))
kc, vc, table = gpu.paged_kv(k, v, cu_k, 64, seed=64)
gpu.attention_varlen(q, kc, vc, gpu.varlen_batch(cu_q, cu_k, block_table=table, page_size=64), causal=True)
torch.cuda.synchronize()
