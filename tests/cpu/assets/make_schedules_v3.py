"""Made ``schedules_v3.db``: a schedule database frozen at schema revision 0003, the last with the
fixed baseline columns ``torch_cudnn_ms`` and ``torch_flash_ms``.

The file is committed and never regenerated: ``tests/cpu/test_db.py`` reads it unmigrated and
migrates a copy of it, checking that every baseline value lands in ``baselines_ms`` (and that a
NULL is left out). Its rows: three families, both columns, one, the other, neither, and a
simulated row. Kept for the record (rerunning it needs revision 0003 of ``db/migrations`` and
the families' codecs of its day, and writes the same rows):

    python tests/cpu/assets/make_schedules_v3.py tests/cpu/assets/schedules_v3.db
"""

from __future__ import annotations

import sys
from pathlib import Path

from sqlalchemy import create_engine, text

from db import _migrate, canonical_json
from tiledattention.tooling import codecs

_GQA = {"heads_q": 32, "heads_kv": 8, "head_dim": 128, "dtype": "bf16"}
FORWARD_SCHEDULE = {"format": 1, "tile_m": 128, "tile_n": 64, "occupancy": 2}
DECODE_SCHEDULE = {"format": 1, "tile_m": 16, "tile_n": 128, "splits": 4, "occupancy": 2}
BACKWARD_SCHEDULE = {"format": 1, "dq_tile_m": 128, "dq_tile_n": 64, "dkdv_tile_m": 64,
                     "dkdv_tile_n": 64}

ROWS = [  # (family, backend, problem, schedule, median ms, torch_cudnn_ms, torch_flash_ms)
    ("forward", "gpu", {"batch": 1, "seqlen_q": 4096, "seqlen_k": 4096, "causal": True, **_GQA},
     FORWARD_SCHEDULE, 1.25, 1.5, 2.25),
    ("forward", "gpu", {"batch": 4, "seqlen_q": 1024, "seqlen_k": 1024, "causal": False,
                        **_GQA, "dtype": "fp16"}, FORWARD_SCHEDULE, 0.25, None, 0.875),
    ("decode", "gpu", {"batch": 2, "seqlen_q": 1, "seqlen_k": 8192, "causal": False, **_GQA},
     DECODE_SCHEDULE, 0.03125, 0.0625, None),
    ("backward", "gpu", {"batch": 1, "seqlen_q": 2048, "seqlen_k": 2048, "causal": True, **_GQA},
     BACKWARD_SCHEDULE, 3.5, None, None),
    ("forward", "simulated", {"batch": 8, "seqlen_q": 512, "seqlen_k": 512, "causal": True,
                              **_GQA}, FORWARD_SCHEDULE, 0.5, 0.375, 0.75),
]


def main(path: str) -> None:
    target = Path(path)
    if target.exists():
        raise SystemExit(f"{target} exists; the asset is frozen, do not regenerate it")
    known = codecs()
    engine = create_engine(f"sqlite:///{target}")
    with engine.begin() as connection:
        _migrate.upgrade(connection, "0003")
        for i, (family, backend, problem, schedule, ms, cudnn, flash) in enumerate(ROWS):
            codec = known[family]
            value = codec.problem(problem)
            schedule = codec.schedule(schedule).to_dict()  # as the family writes it
            terms = list(codec.terms(value)) + [None] * 4
            connection.execute(text(
                "INSERT INTO schedules (family, arch, device_name, backend, problem, bucket, "
                "term0, term1, term2, term3, schedule, median_ms, spread_ms, tflops, default_ms, "
                "torch_cudnn_ms, torch_flash_ms, trials, created_at, template_hash, cuda_tile, "
                "tileiras, torch, driver) VALUES (:family, 'sm_90', 'NVIDIA H100 80GB HBM3', "
                ":backend, :problem, :bucket, :t0, :t1, :t2, :t3, :schedule, :ms, 0.01, 123.5, "
                ":default, :cudnn, :flash, 20, :created, 'tmplv3hash00', '1.7.0', '13.4.92', "
                "'2.11.0', '13.0')"),
                dict(family=family, backend=backend, problem=codec.problem_text(value),
                     bucket=codec.bucket_text(value), t0=terms[0], t1=terms[1], t2=terms[2],
                     t3=terms[3], schedule=canonical_json(schedule), ms=ms, default=ms * 2,
                     cudnn=cudnn, flash=flash, created=f"2026-11-0{i + 1} 12:00:00.000000"))
    with engine.connect() as connection:
        connection.exec_driver_sql("VACUUM")
    engine.dispose()


if __name__ == "__main__":
    main(sys.argv[1])
