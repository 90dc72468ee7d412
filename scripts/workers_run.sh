#!/usr/bin/env bash
# One shared study on several GPUs of one host (issue 36): `--workers 1` and `--workers N` on the
# same keys, each run with its own schedule database, study storage and a cold cuTile compile
# cache; then a Ctrl-C of a `--workers N` run and the re-run that resumes it.
#
#     scripts/workers_run.sh OUT N forward decode    # steps: forward decode backward interrupt
#
# Writes OUT/<step>-w<W>.{out,log,study,rows}; prints one line per run.
set -uo pipefail
out=$1; n=$2; shift 2
work=${TMPDIR:-/tmp}/workers_run; mkdir -p "$out" "$work"
tt=(tiledtune); command -v tiledtune > /dev/null || tt=(python3 -m tuner.cli)
common=(--device sm_90 --trials 6 --space compact --patience 0 ${EXTRA:-})

keys() {
  case $1 in
    forward) echo --shape 2,16,1024,128 --shape 2,8,1000,64 --causal yes,no ;;
    backward) echo --kernel backward --shape 2,16,1024,128 --shape 1,32/8,2048,128 --causal yes,no ;;
    decode)
      for p in "1,32,8,4096" "4,32,8,8192" "1,64,8,32768" "8,16,16,2048"; do
        IFS=, read -r b hq hkv sk <<< "$p"
        echo --problem "batch=$b,heads_q=$hq,heads_kv=$hkv,seqlen_q=1,seqlen_k=$sk,head_dim=128,dtype=bf16,causal=false"
      done; echo --kernel decode ;;
  esac
}

run() {  # run STEP W [extra args...]: one search, cold compile cache, its own files
  local step=$1 w=$2; shift 2
  local d=$work/$step-w$w; rm -rf "$d"; mkdir -p "$d"
  local t0=$(date +%s%N)
  CUDA_TILE_CACHE_DIR=$d/cache timeout 280 "${tt[@]}" search "${common[@]}" $(keys "${step%%-*}") \
      --workers "$w" --db "$d/s.sqlite" --storage "sqlite:///$d/st.sqlite" "$@" \
      > "$out/$step-w$w.out" 2> "$out/$step-w$w.log"
  local rc=$? t1=$(date +%s%N)
  python scripts/check_study.py "sqlite:///$d/st.sqlite" > "$out/$step-w$w.study" 2>&1
  "${tt[@]}" list --db "$d/s.sqlite" --json > "$out/$step-w$w.rows" 2>&1
  printf '%-9s workers %s  exit %s  wall %6.1f s\n' "$step" "$w" "$rc" "$(( (t1 - t0) / 1000000 ))e-3"
}

interrupt() {  # a --workers N forward run, SIGINT to its process group after 25 s, then resume
  local d=$work/interrupt-w$n; rm -rf "$d"; mkdir -p "$d"
  # a background job starts with SIGINT ignored (and tiledtune keeps it so): give it back the
  # default, as a terminal's foreground job has, before exec
  setsid bash -c "CUDA_TILE_CACHE_DIR=$d/cache exec python3 -c 'import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_DFL); os.execvp(sys.argv[1], sys.argv[1:])' ${tt[*]} search ${common[*]} $(keys forward) \
      --workers $n --db $d/s.sqlite --storage sqlite:///$d/st.sqlite" \
      > "$out/interrupt-w$n.out" 2> "$out/interrupt-w$n.log" &
  local pid=$!; sleep 25
  local t0=$(date +%s%N); kill -INT -- -"$pid"
  while pgrep -f "tuner.cli.*$d" > /dev/null || kill -0 "$pid" 2> /dev/null; do
    { echo "+$(( ($(date +%s%N) - t0) / 1000000 )) ms"; pgrep -af "tuner.cli.*$d" | cut -c1-150; } \
        >> "$out/interrupt-w$n.procs"; sleep 0.5
  done
  local t1=$(date +%s%N); wait "$pid"; local rc=$?
  printf 'interrupt workers %s  exit %s  every process gone %.2f s after SIGINT\n' \
      "$n" "$rc" "$(( (t1 - t0) / 1000000 ))e-3"
  python scripts/check_study.py "sqlite:///$d/st.sqlite" > "$out/interrupt-w$n.before" 2>&1
  local t2=$(date +%s%N)
  CUDA_TILE_CACHE_DIR=$d/cache timeout 280 "${tt[@]}" search "${common[@]}" $(keys forward) \
      --workers "$n" --db "$d/s.sqlite" --storage "sqlite:///$d/st.sqlite" \
      > "$out/resume-w$n.out" 2> "$out/resume-w$n.log"
  rc=$?; local t3=$(date +%s%N)
  python scripts/check_study.py "sqlite:///$d/st.sqlite" > "$out/resume-w$n.study" 2>&1
  "${tt[@]}" list --db "$d/s.sqlite" --json > "$out/resume-w$n.rows" 2>&1
  printf 'resume    workers %s  exit %s  wall %6.1f s\n' "$n" "$rc" "$(( (t3 - t2) / 1000000 ))e-3"
}

nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
for step in "$@"; do
  if [ "$step" = interrupt ]; then interrupt; else run "$step" 1; run "$step" "$n"; fi
done
