"""What the GPU scripts share: on a machine without a CUDA GPU, one line and exit status 2 (a
usage condition, as ``tiledtune`` reports one), never a traceback from deep inside torch."""

from __future__ import annotations

import sys
from pathlib import Path


def require_gpu() -> None:
    """Return when torch sees a CUDA GPU; else say so on standard error and exit with status 2."""
    import torch

    if torch.cuda.is_available():
        return
    script = Path(sys.argv[0]).name
    print(f"{script}: needs a CUDA GPU, and torch sees none (torch {torch.__version__}, "
          "torch.cuda.is_available() is False); run it on the GPU machine", file=sys.stderr)
    raise SystemExit(2)
