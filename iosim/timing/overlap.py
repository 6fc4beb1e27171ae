"""The time model's one fitted constant: how much of a second stream of work does not hide under the first.

Two thread blocks resident on an SM (FlashAttention-2-class kernels), or two warpgroups in ping-pong (FlashAttention-3's
softmax under the other warpgroup's GEMM), each run a sequence of phases on different units. Perfect overlap would
make a step cost its longest part; no overlap, the sum. What they reach sits between: step = longest +
OVERLAP_LOSS × the rest. No calibration kernel isolates it (it is the issue logic of the kernels themselves), so it is
fitted, once, on one GPU, and reported on the other without refitting (docs/timing.md):

    python benchmarks/time_record.py --device h100 --fit
"""

OVERLAP_LOSS = 0.45
"""Fitted 2026-11-24 on nvidia-h100-x1 (NVIDIA H100 80GB HBM3, driver 580.159.04): the value in 0..1 (steps of 0.01)
with the smallest median |predicted − measured| / measured over data/validation/h100-time.json. Fitted again the same
day after the naive model, the cost of mixing DRAM reads and writes and a call's fixed costs changed the model (still
0.44), and once more when that record was measured again after naive.cu's softmax change (84d0f0d): 0.45, 4.1% over
all 183 rows (every kernel). The H200's record is reported with this value, never fitted there."""
