"""The program ncu profiles (``python -m tuner.profile._target REQUEST.json``): the request's
family runs its tuner case's launches for the problem under the schedule once to compile and
warm up, then once more between ``cudaProfilerStart`` and ``cudaProfilerStop``, so ncu sees
exactly the kernels of one call (a decode's split and merge kernels, a backward's dQ and dK/dV
kernels)."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    import torch

    from tiledattention import get_family

    request = json.loads(Path(argv[0]).read_text())
    family = get_family(request["family"])
    problem = family.problem_type.from_dict(request["problem"])
    schedule = family.schedule_type.from_dict(request["schedule"])
    run = family.case(problem, torch.cuda.current_device()).launcher(schedule)
    run()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    run()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
