#!/bin/bash
source .devtk/setup.sh >/dev/null 2>&1
export PYTHONWARNINGS=ignore
P=docs/records/probes/fp8_fast_acc.py
(timeout 300 python3 -m pytest -q -p no:cacheprovider -n 6 tests/gpu/test_fp8_gpu.py > $OUT/tests.log 2>&1; echo "rc=$?" >> $OUT/tests.log) &
for i in 0 1 2 3 4; do (timeout 300 python3 $P --d256 --only $i --rounds 1 > $OUT/warm-$i.log 2>&1) & done
wait
timeout 240 python3 $P --d256 --rounds 10 > $OUT/d256.log 2>&1
tail -3 $OUT/tests.log; cat $OUT/d256.log
