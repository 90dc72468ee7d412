#!/bin/sh
# The split head-dim backward shapes of docs/records/benchmarks/backward/split-head-dim.md (none of them
# in the tuning grid or in backward_splits.py --split-d). Usage: sh THIS [tiledtune bench options...]
P=""
for s in \
 batch=4,heads_q=32,heads_kv=8,seqlen_q=2048,seqlen_k=2048,head_dim=72,dtype=bf16,causal=yes \
 batch=2,heads_q=16,heads_kv=16,seqlen_q=4096,seqlen_k=4096,head_dim=72,dtype=fp16,causal=no \
 batch=16,heads_q=20,heads_kv=20,seqlen_q=1024,seqlen_k=1024,head_dim=80,dtype=bf16,causal=no \
 batch=1,heads_q=24,heads_kv=8,seqlen_q=8192,seqlen_k=8192,head_dim=80,dtype=bf16,causal=yes \
 batch=8,heads_q=16,heads_kv=16,seqlen_q=1500,seqlen_k=1500,head_dim=40,dtype=fp16,causal=yes \
 batch=2,heads_q=16,heads_kv=4,seqlen_q=4096,seqlen_k=4096,head_dim=192,dtype=bf16,causal=yes \
 batch=4,heads_q=8,heads_kv=8,seqlen_q=2000,seqlen_k=2000,head_dim=192,dtype=fp16,causal=no \
 batch=2,heads_q=32,heads_kv=8,seqlen_q=3000,seqlen_k=3000,head_dim=96,dtype=bf16,causal=yes
do P="$P --problem $s"; done
exec python3 -m tuner.cli bench --kernel backward $P "$@"
