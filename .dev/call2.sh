set -u
nvidia-smi -L; date; S=$SECONDS
python -m pytest -q -p no:cacheprovider tests/gpu/test_paged_prefill_gpu.py 2>&1 | tail -3; echo "tests $((SECONDS-S)) s"
python benchmarks/bench_varlen.py --parts paged --check --gqa --d 64 128 --out $OUT/b1 > $OUT/b1.log 2>&1; echo "bench1 $((SECONDS-S)) s"
python benchmarks/bench_varlen.py --parts paged --gqa --d 64 128 --out $OUT/b2 > $OUT/b2.log 2>&1; echo "bench2 $((SECONDS-S)) s"
ncu --clock-control none --kernel-name regex:flash_fwd --metrics gpu__time_duration.sum,smsp__inst_executed.sum,launch__registers_per_thread,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio python .dev/paged_ncu.py > $OUT/ncu.log 2>&1; echo "ncu $((SECONDS-S)) s"
python benchmarks/sanitize_varlen.py --paged > /dev/null 2>&1
for t in memcheck racecheck synccheck; do compute-sanitizer --tool $t python benchmarks/sanitize_varlen.py --paged > $OUT/san_$t.log 2>&1; echo "$t rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/san_$t.log | tail -1)"; done; echo "sanitize $((SECONDS-S)) s"
grep -E "flash_fwd_kernel|duration|inst_executed|registers|barrier" $OUT/ncu.log | sed 's/(const T4.*//' | awk '{print $1, $2, $NF}'
grep "^| paged |" $OUT/b1.log; grep "^| paged |" $OUT/b2.log
