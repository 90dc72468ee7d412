"""Compile, for sm_90 and in a pool of processes (``compile_ahead``), every kernel the calls of a
survey's lines (``survey_shapes.py``'s output, ``FAMILY --problem ... --problem ...`` a line)
launch through the runtime's lookup (``tuner.lookup.runtime_resolution`` over the shipped rows),
so that the benches that follow on the GPU machine find them in cuTile's cache instead of
compiling them one at a time. A backward call's forward (the kernel that keeps the
log-sum-exp) is compiled with it.

    python3 docs/records/probes/survey_compile.py survey_lines.txt
"""

import sys
from pathlib import Path

import tiledattention as ta
from tuner.commands._problems import parse_problem_fields
from tuner.lookup import runtime_resolution, shipped_rows

sys.path.insert(0, str(Path(__file__).parent))
from compile_ahead import compile_ahead  # noqa: E402

#: the families whose kernels a survey line's calls launch
FAMILIES = {"forward": ("FORWARD",), "backward": ("FORWARD", "BACKWARD"), "decode": ("DECODE",)}


def main():
    jobs = {name: [] for name in ("FORWARD", "BACKWARD", "DECODE")}
    for line in Path(sys.argv[1]).read_text().splitlines():
        name, *args = line.split()
        for text in args:
            if text == "--problem":
                continue
            problem = ta.Problem(**parse_problem_fields(text))
            for each in FAMILIES[name]:
                family = getattr(ta, each)
                schedule = runtime_resolution(family, problem, shipped_rows(family, "sm_90"),
                                              "sm_90").schedule
                jobs[each].append((family.plan_problem(problem), schedule))
    for each, found in jobs.items():
        compile_ahead(found, family=each, launchable=True)
    print(f"compiled the kernels of {sum(map(len, jobs.values()))} (call, family) pairs")


if __name__ == "__main__":
    main()
