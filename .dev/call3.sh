nvidia-smi -L; S=$SECONDS
python .dev/paged_ncu64.py 64
ncu --clock-control none --kernel-name regex:flash_fwd --section WarpStateStats --section InstructionStats --section SourceCounters python .dev/paged_ncu64.py 64 > $OUT/ncu64.log 2>&1; echo "ncu $((SECONDS-S)) s"
ncu --clock-control none --kernel-name regex:flash_fwd --section SourceCounters --section WarpStateStats python .dev/paged_ncu64.py 128 > $OUT/ncu128.log 2>&1; echo "ncu $((SECONDS-S)) s"
ncu --clock-control none --kernel-name regex:flash_fwd --set full --import-source no -o $OUT/d64 python .dev/paged_ncu64.py 64 > /dev/null 2>&1; echo "ncu full $((SECONDS-S)) s"
ncu --import $OUT/d64.ncu-rep --page source --print-source sass --csv > $OUT/d64_source.csv 2>&1; ls -la $OUT; echo "done $((SECONDS-S)) s"
grep -E "flash_fwd_kernel<|Stall|Warp Cycles|Issued Ipc|Executed Instructions " $OUT/ncu64.log | cut -c1-130 | head -60
