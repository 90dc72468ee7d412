"""Compile-only (CPU, sm_90): the one-split decode walk (``kernels/decode/_kernel.py``) folding
each key tile whole or as ``key_slices`` slices of its keys. Prints, for the key loop of each
form's SASS, its instructions, the named barriers, shared-memory loads and stores and shuffles
a key tile costs (sections 59-60 of ``docs/records/benchmarks/paged/issue49/README.md``; the
stand-alone walk of section 59 at d06c1f7). Needs ``cuobjdump`` on ``PATH`` (the
``nvidia-cuda-cuobjdump`` wheel).

    python docs/records/probes/decode_key_slices_sass.py
"""
import collections
import re
import subprocess
import tempfile

import tiledattention as ta

#: (head dim, key step): a D 128 call of 84 rows over 1280 keys, its D 64 twin
FORMS = ((128, 128), (64, 256))


def key_loop(sass: str) -> collections.Counter:
    """Opcode counts of the shortest backward-branching loop that holds an MMA."""
    ins = [(int(a, 16), t.strip()) for a, t in
           re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*?)\s*;", sass)]
    best = None
    for addr, text in ins:
        hit = re.search(r"BRA\s+0x([0-9a-f]+)", text)
        if hit and int(hit.group(1), 16) < addr:
            body = [t for a, t in ins if int(hit.group(1), 16) <= a <= addr]
            ops = collections.Counter(t.split()[t.startswith("@")].split(".")[0] for t in body)
            if ops["HMMA"] and (best is None or len(body) < sum(best.values())):
                best = ops
    return best or collections.Counter()


def main():
    print("D  TILE_N  slices  instructions  HMMA  BAR  LDS  STS  SHFL")
    for d, tile_n in FORMS:
        problem = ta.Problem(batch=3, heads_q=28, heads_kv=28, seqlen_q=1, seqlen_k=1280,
                             head_dim=d, dtype="bf16", causal=False)
        for slices in (1, 2, 4, 8):
            schedule = ta.DecodeSchedule(tile_n=tile_n, k_latency=2, v_latency=2,
                                         key_slices=slices)
            with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
                f.write(ta.DECODE.compile(problem, schedule, "sm_90").cubin)
                f.flush()
                sass = subprocess.run(["cuobjdump", "-sass", f.name], check=True,
                                      capture_output=True, text=True).stdout
            ops = key_loop(sass)
            print(f"{d}  {tile_n}  {slices}  {sum(ops.values())}  " +
                  "  ".join(str(ops[k]) for k in ("HMMA", "BAR", "LDS", "STS", "SHFL")))


if __name__ == "__main__":
    main()
