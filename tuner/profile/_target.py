"""The program ncu profiles (``python -m tuner.profile._target REQUEST.json``): the request's
family runs its tuner case's launches for the problem under the schedule (or, where the
request names a ``baseline``, that PyTorch baseline of the case, e.g. ``torch-cudnn``) once to
compile and warm up, then once more between ``cudaProfilerStart`` and ``cudaProfilerStop``, so
ncu sees exactly the kernels of one call (a decode's split and merge kernels, a backward's dQ
and dK/dV kernels; a baseline backward's kernels without its forward)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

#: how a line of the target's own refusal starts (``_ncu`` shows the rest as a usage error)
REFUSED = "tiledtune-profile refused: "


def main(argv: list[str]) -> int:
    import torch

    from tiledattention import get_family

    request = json.loads(Path(argv[0]).read_text())
    family = get_family(request["family"])
    problem = family.problem_type.from_dict(request["problem"])
    case = family.case(problem, torch.cuda.current_device())
    if request.get("baseline"):
        offered = case.baselines()
        if request["baseline"] not in offered:
            print(f"{REFUSED}--compare {request['baseline']}: the {family.name} case of "
                  f"{problem.describe()} has no such baseline (it has: "
                  f"{', '.join(offered) or 'none'})", file=sys.stderr)
            return 3
        run = offered[request["baseline"]]
    else:
        run = case.launcher(family.schedule_type.from_dict(request["schedule"]))
    run()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    run()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
