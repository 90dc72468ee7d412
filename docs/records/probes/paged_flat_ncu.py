"""Where the flat walk loses to the split rule (issue 49, section 33 of
``docs/records/benchmarks/paged/issue49/README.md``): the flat walk and the split rule on the
same paged batches, one launch each under Nsight Compute (``prefill_ncu.profile``), cycling
cache lengths; the batches where section 31-32 measured the flat walk slower (B12 H32/8 over
20000 keys in pages of 16, B40 H32/8 over 2000 keys in pages of 128) and one where it is faster
(B24 H28/4 over 6000 keys in pages of 16).

    source .devtk/setup.sh && ncu --profile-from-start off --clock-control none \\
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section LaunchStats \\
        --section Occupancy --section WarpStateStats --section InstructionStats \\
        --export $OUT/flat --force-overwrite python3 docs/records/probes/paged_flat_ncu.py
    ncu --import $OUT/flat.ncu-rep --page details --csv > $OUT/details.csv
"""

import sys
from pathlib import Path

import tiledattention as ta
from tiledattention.kernels.decode._launch import normalise

sys.path.insert(0, str(Path(__file__).parent))
from prefill_ncu import profile  # noqa: E402

#: (batch, H_q, H_kv, longest cache, page size), D 128 bf16
BATCHES = ((12, 32, 8, 20000, 16), (40, 32, 8, 2000, 128), (24, 28, 4, 6000, 16))


def main():
    fns = {}
    for b, hq, hkv, sk, page in BATCHES:
        p = ta.Problem(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=1, seqlen_k=sk, head_dim=128,
                       dtype="bf16", causal=True, bottom_right=True, ragged=True,
                       page_size=page)
        case = ta.DECODE.case(p, 0)
        default = ta.DECODE.default_schedule("sm_90", p)
        for s in (normalise(p, default.replace(flat=True)),
                  normalise(p, default.replace(flat=False))):
            tag = f"B{b} H{hq}/{hkv} {sk} pages {page} {s.describe()}"
            print(tag, flush=True)
            fns[tag] = case.launcher(s)
    profile(fns)


if __name__ == "__main__":
    main()
