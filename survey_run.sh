#!/bin/bash
for fam in "$@"; do
  args=$(grep "^$fam " survey_lines.txt | cut -d' ' -f2-)
  echo "=== $fam"
  python3 -m tuner.cli bench --kernel $fam $args --contenders tiledattention,torch-cudnn \
     --interleave 8 --no-plots $( [ $fam != decode ] && echo --no-matmul) --out $OUT/$fam > $OUT/$fam.log 2>&1
  echo "rc=$?"; tail -3 $OUT/$fam.log
done
