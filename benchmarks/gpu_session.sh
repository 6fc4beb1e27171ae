#!/usr/bin/env bash
# One call on the lent GPU machine: GPU tests, compute-sanitizer, benchmark. Logs go to $OUT (the device tool's
# folder that comes back), the short summary to stdout last.
#   usage (repository root; the wheels the steps import (the gpu extra, torch, pytest) in .whl/, carried with the call):
#     bash benchmarks/gpu_session.sh [tests] [sanitize] [bench] [bench-quick] [tiles] [record] [calibrate] [decode]
#       [varlen]
#   decode: Flash-Decoding's GPU tests, its sanitizer cases (memcheck, racecheck, synccheck) and bench_decode.py --check.
#   varlen: varlen and sliding-window GPU tests, their sanitizer cases (memcheck, racecheck, synccheck) and
#   bench_varlen.py --check.
#   record: the validation sweep (docs/validation.md), its archive copied to $OUT; calibrate: the L2 probes and
#   block timelines (iosim calibrate ... --measure).
set -uo pipefail
OUT=${OUT:-/tmp/iosim_out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HYPOTHESIS_PROFILE=ci
steps=${*:-tests sanitize bench}
summary=()
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
echo "commit: ${IOSIM_COMMIT:-unknown (set IOSIM_COMMIT)}" | tee -a "$OUT/gpu.txt"
for s in $steps; do
  case $s in
    tests)
      python3 -m pytest -q -p no:cacheprovider tests/gpu tests/test_gpu_api_cpu.py -rfE 2>&1 | tee "$OUT/tests.log" | tail -25
      summary+=("tests: $(tail -1 "$OUT/tests.log")") ;;
    sanitize)
      python3 benchmarks/sanitize_cases.py > /dev/null 2>&1  # warm CuPy's kernel cache outside the sanitizer
      for tool in memcheck racecheck; do
        compute-sanitizer --tool $tool --print-limit 20 python3 benchmarks/sanitize_cases.py > "$OUT/san_$tool.log" 2>&1
        summary+=("$tool: rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|sanitize_cases' "$OUT/san_$tool.log" | tr '\n' ' ')")
      done ;;
    bench)
      python3 benchmarks/bench_attention.py --csv "$OUT/bench.csv" 2>&1 | tee "$OUT/bench.log" | tail -52
      summary+=("bench: see table above") ;;
    bench-quick)
      python3 benchmarks/bench_attention.py --d 128 --n 2048 4096 --dtype bf16 --csv "$OUT/bench.csv" 2>&1 \
        | tee "$OUT/bench.log" | tail -8 ;;
    ncu)  # bank conflicts of the flash kernel; DRAM bytes of each kernel (naive: S and P materialized)
      m=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,smsp__inst_executed_op_ldsm.sum
      m=$m,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum
      ncu --clock-control none --profile-from-start off --metrics $m --csv python3 benchmarks/ncu_kernels.py \
        > "$OUT/ncu.csv" 2> "$OUT/ncu.err"; summary+=("ncu: rc=$?")
      m2=l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum
      m2=$m2,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum
      ncu --clock-control none --profile-from-start off --metrics $m2 --csv python3 benchmarks/ncu_kernels.py \
        > "$OUT/ncu2.csv" 2> "$OUT/ncu2.err"; summary+=("ncu2: rc=$?")
      grep -a -E '"(gpu__|dram__|smsp__|l1tex__)' "$OUT/ncu.csv" "$OUT/ncu2.csv" \
        | awk -F'","' '{print $5" | "$(NF-2)" | "$NF}' | sed 's/"$//' | cut -c1-160 ;;
    record)
      python3 benchmarks/validation_record.py --measure --no-figure 2>&1 | tee "$OUT/record.log" | tail -30
      cp data/validation/*-sweep.tar.xz "$OUT/"; summary+=("record: rc=${PIPESTATUS[0]}") ;;
    calibrate)
      python3 -m iosim calibrate l2 --measure --json "$OUT/probes.json" 2>&1 | tee "$OUT/calibrate.log" | tail -8
      python3 -m iosim calibrate block-share --measure 2>&1 | tee -a "$OUT/calibrate.log" | tail -7 ;;
    decode)
      python3 -m pytest -q -p no:cacheprovider tests/gpu/test_decode_gpu.py tests/test_decode_api.py -rfE 2>&1 \
        | tee "$OUT/decode_tests.log" | tail -15
      summary+=("decode tests: $(tail -1 "$OUT/decode_tests.log")")
      python3 benchmarks/sanitize_decode.py > /dev/null 2>&1  # warm CuPy's kernel cache outside the sanitizer
      for tool in memcheck racecheck synccheck; do
        compute-sanitizer --tool $tool --print-limit 20 python3 benchmarks/sanitize_decode.py > "$OUT/san_decode_$tool.log" 2>&1
        summary+=("decode $tool: rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|sanitize_decode' "$OUT/san_decode_$tool.log" | tr '\n' ' ')")
      done
      python3 benchmarks/bench_decode.py --check --out "$OUT" 2>&1 | tee "$OUT/bench_decode.log" | tail -42
      summary+=("bench_decode: rc=${PIPESTATUS[0]}") ;;
    varlen)
      python3 -m pytest -q -p no:cacheprovider tests/gpu/test_varlen_gpu.py tests/test_varlen_api.py -rfE 2>&1 \
        | tee "$OUT/varlen_tests.log" | tail -15
      summary+=("varlen tests: $(tail -1 "$OUT/varlen_tests.log")")
      python3 benchmarks/sanitize_varlen.py > /dev/null 2>&1  # warm CuPy's kernel cache outside the sanitizer
      for tool in memcheck racecheck synccheck; do
        compute-sanitizer --tool $tool --print-limit 20 python3 benchmarks/sanitize_varlen.py > "$OUT/san_varlen_$tool.log" 2>&1
        summary+=("varlen $tool: rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|sanitize_varlen' "$OUT/san_varlen_$tool.log" | tr '\n' ' ')")
      done
      python3 benchmarks/bench_varlen.py --check --out "$OUT" 2>&1 | tee "$OUT/bench_varlen.log" | tail -30
      summary+=("bench_varlen: rc=${PIPESTATUS[0]}") ;;
    tiles)
      python3 benchmarks/bench_attention.py --no-peers --d 64 128 --n 4096 --dtype bf16 \
        --tiles 128x32 64x64 128x64 64x128 --csv "$OUT/tiles.csv" 2>&1 | tee "$OUT/tiles.log" | tail -14 ;;
  esac
done
printf '%s\n' "${summary[@]}"
