"""The commit a bench run measures, for the header of its report.

    from revision import commit     # a bench script's own folder is on sys.path
    f"commit {commit()}"
"""

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def commit(short: bool = True) -> str:
    """W12_REV where it is set; else the REV file that bench/rev_tree.sh writes at the root of a revision's tree (the
    GPU machine runs such trees, where no .git or a stale one lies); else `git rev-parse HEAD` of this checkout;
    else '?'."""
    rev = os.environ.get("W12_REV")
    if rev:
        return rev
    if (ROOT / "REV").is_file():
        return (ROOT / "REV").read_text().strip()
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", *(["--short"] if short else []), "HEAD"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    return out.stdout.strip() if out.returncode == 0 else "?"
