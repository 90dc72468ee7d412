"""Made ``schedules_v1.db``: a schedule database frozen at schema revision 0001.

The file is committed and never regenerated: ``tests/cpu/test_db.py`` migrates a copy of it to
check that an upgrade keeps every row. Kept for the record (rerunning it needs revision 0001 of
``db/migrations`` and writes the same rows):

    python tests/cpu/assets/make_schedules_v1.py tests/cpu/assets/schedules_v1.db

Its schedule cells were first written with three fields (``tile_m``, ``tile_n``,
``occupancy``), a dict no release of the tool ever wrote (``Schedule.to_dict`` of format 1 wrote
all of ``FORMAT1``). Since issue 30 a stored schedule must name every field of format 1, so the
three cells were updated in place (``UPDATE schedules SET schedule = ...``, then ``VACUUM``) to
what this script now writes; nothing else in the file changed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from sqlalchemy import create_engine, text

from db import _migrate

#: every field of the forward schedule's format 1 as first written (commit fb6bd79), at its default
FORMAT1 = dict(tile_m=64, tile_n=64, occupancy=1, num_ctas=1, opt_level=3, k_latency=None,
               v_latency=None, k_transposed=False, allow_tma=True, exp2=False, approx_div=False,
               kv_sawtooth=False, longest_first=False, unchecked_loads=False)

ROWS = [  # (device, dtype, causal, B, Hq, Hkv, Sq, Sk, D, tile_m, tile_n, median, cudnn)
    ("NVIDIA H100 80GB HBM3", "bf16", True, 1, 32, 8, 4096, 4096, 128, 128, 64, 1.25, 1.5),
    ("NVIDIA H100 80GB HBM3", "fp16", False, 4, 16, 16, 1024, 1024, 64, 64, 64, 0.25, None),
    ("NVIDIA H100 PCIe", "bf16", True, 2, 8, 1, 2048, 512, 256, 64, 32, 0.75, 0.5),
]


def main(path: str) -> None:
    target = Path(path)
    if target.exists():
        raise SystemExit(f"{target} exists; the asset is frozen, do not regenerate it")
    engine = create_engine(f"sqlite:///{target}")
    with engine.begin() as connection:
        _migrate.upgrade(connection, "0001")
        for i, (device, dtype, causal, b, hq, hkv, sq, sk, d, tm, tn, ms, cudnn) in \
                enumerate(ROWS):
            schedule = json.dumps({"format": 1, **FORMAT1, "tile_m": tm, "tile_n": tn,
                                   "occupancy": 2}, sort_keys=True)
            connection.execute(text(
                "INSERT INTO schedules (arch, device_name, dtype, causal, batch, heads_q, "
                "heads_kv, seqlen_q, seqlen_k, head_dim, schedule, median_ms, spread_ms, tflops, "
                "default_ms, torch_cudnn_ms, trials, created_at, template_hash, cuda_tile, "
                "tileiras, torch, driver) VALUES ('sm_90', :device, :dtype, :causal, :b, :hq, "
                ":hkv, :sq, :sk, :d, :schedule, :ms, 0.01, 123.5, :default, :cudnn, 20, "
                ":created, 'tmplv1hash00', '1.7.0', '13.1.0', '2.9.0', '13.0')"),
                dict(device=device, dtype=dtype, causal=causal, b=b, hq=hq, hkv=hkv, sq=sq,
                     sk=sk, d=d, schedule=schedule, ms=ms, default=ms * 2, cudnn=cudnn,
                     created=f"2025-06-0{i + 1} 12:00:00.000000"))
    with engine.connect() as connection:
        connection.exec_driver_sql("VACUUM")
    engine.dispose()


if __name__ == "__main__":
    main(sys.argv[1])
