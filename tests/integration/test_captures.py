"""The console captures the docs include are the commands' current output (scripts/captures.py --check)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_docs_captures_match_what_the_commands_print_now():
    check = subprocess.run([sys.executable, "scripts/captures.py", "--check"], cwd=ROOT, capture_output=True,
                           text=True, timeout=300)
    assert check.returncode == 0, check.stdout[-5000:] + check.stderr[-3000:]
