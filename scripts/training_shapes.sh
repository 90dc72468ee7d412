#!/bin/sh
# The backward's 16 training shapes of issue 47's measurement (none of them in the tuning grid of
# scripts/tune_backward_shipped.py): group sizes 1, 3, 4, 7, 8 and multi-query; D 64, 72, 96, 128,
# 256; S 512-16k; causal, full and bottom-right S_q != S_k; bf16 and fp16; batch 1-32.
# Usage: scripts/training_shapes.sh FIRST LAST [tiledtune bench options...]  (1-based, inclusive)
first=$1; last=$2; shift 2
i=0; args=""
while read -r shape; do
  i=$((i + 1))
  [ "$i" -ge "$first" ] && [ "$i" -le "$last" ] && args="$args --problem $shape"
done <<'SHAPES'
batch=1,heads_q=32,heads_kv=8,seqlen_q=4096,seqlen_k=4096,head_dim=128,dtype=bf16,causal=yes
batch=8,heads_q=16,heads_kv=16,seqlen_q=577,seqlen_k=577,head_dim=64,dtype=bf16,causal=no
batch=2,heads_q=28,heads_kv=4,seqlen_q=3000,seqlen_k=3000,head_dim=128,dtype=bf16,causal=yes
batch=1,heads_q=48,heads_kv=1,seqlen_q=8192,seqlen_k=8192,head_dim=128,dtype=fp16,causal=yes
batch=4,heads_q=14,heads_kv=2,seqlen_q=1536,seqlen_k=1536,head_dim=64,dtype=bf16,causal=yes
batch=2,heads_q=16,heads_kv=8,seqlen_q=4096,seqlen_k=4096,head_dim=256,dtype=bf16,causal=yes
batch=16,heads_q=12,heads_kv=12,seqlen_q=1000,seqlen_k=1000,head_dim=64,dtype=fp16,causal=no
batch=1,heads_q=28,heads_kv=4,seqlen_q=16384,seqlen_k=16384,head_dim=128,dtype=bf16,causal=yes
batch=2,heads_q=8,heads_kv=8,seqlen_q=4096,seqlen_k=4096,head_dim=96,dtype=fp16,causal=no
batch=8,heads_q=32,heads_kv=8,seqlen_q=1024,seqlen_k=1024,head_dim=72,dtype=bf16,causal=yes
batch=32,heads_q=8,heads_kv=8,seqlen_q=512,seqlen_k=512,head_dim=64,dtype=fp16,causal=yes
batch=1,heads_q=32,heads_kv=32,seqlen_q=8192,seqlen_k=8192,head_dim=128,dtype=bf16,causal=no
batch=2,heads_q=32,heads_kv=8,seqlen_q=1024,seqlen_k=3072,head_dim=128,dtype=bf16,causal=yes,bottom_right=yes
batch=4,heads_q=24,heads_kv=8,seqlen_q=2500,seqlen_k=2500,head_dim=128,dtype=fp16,causal=yes
batch=1,heads_q=64,heads_kv=8,seqlen_q=6000,seqlen_k=6000,head_dim=64,dtype=bf16,causal=yes
batch=2,heads_q=16,heads_kv=4,seqlen_q=2048,seqlen_k=2048,head_dim=256,dtype=fp16,causal=no
SHAPES
exec tiledtune bench --kernel backward $args "$@"
