#!/bin/bash
source .devtk/setup.sh >/dev/null 2>&1
export PYTHONWARNINGS=ignore
P=docs/records/probes/fp8_fast_acc.py
for i in 6 7; do (timeout 300 python3 $P --tiles --only $i --rounds 1 > $OUT/warm-$i.log 2>&1) & done
wait
timeout 240 python3 $P --tiles --only 6,7 --rounds 10 > $OUT/tiles256.log 2>&1
cat $OUT/tiles256.log; tail -3 $OUT/warm-6.log
