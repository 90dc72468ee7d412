"""Which commit of the project is running: what a measurement record names so that its figures
can be traced to the code that produced them (``tiledtune bench``'s ``run.json``)."""

from __future__ import annotations

import subprocess
from pathlib import Path

__all__ = ["source_commit"]


def source_commit(root: str | Path | None = None) -> tuple[str, bool | None]:
    """``(commit, dirty)`` of the code that runs: the git commit checked out at ``root`` (by
    default the project holding the imported ``tiledattention``) and whether tracked files
    differ from it (untracked files, such as earlier results, do not count). ``("", None)``
    when ``root`` is not the top of a git checkout (an installed package, a copied tree) or git
    cannot say: a run records no commit rather than a guess."""
    if root is None:
        import tiledattention

        root = Path(tiledattention.__file__).resolve().parent.parent

    def git(*argv: str) -> str | None:
        try:
            proc = subprocess.run(["git", "-C", str(root), *argv], capture_output=True,
                                  text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            return None
        return proc.stdout if proc.returncode == 0 else None

    # fails (None) in a checkout without commits too: HEAD names nothing there
    lines = (git("rev-parse", "--show-toplevel", "HEAD") or "").splitlines()
    if len(lines) != 2 or Path(lines[0]).resolve() != Path(root).resolve():
        return "", None
    commit = lines[1].strip()
    status = git("status", "--porcelain", "--untracked-files=no")
    return commit, None if status is None else bool(status.strip())
