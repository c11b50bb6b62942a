"""tests/verl: credo's verl plugin against the real verl (``make verl-check``).

The main suite never collects this folder (``norecursedirs`` in pyproject.toml); here verl
must be importable, so a missing verl is an error, never a skip.
"""

from __future__ import annotations

import sys
from pathlib import Path

try:  # verl's own module: this folder is named verl too and would pass for it on sys.path
    from verl.trainer.ppo import core_algos  # noqa: F401
except ImportError as exc:
    raise RuntimeError(
        "tests/verl needs verl: run `make verl-check`, which builds .venv-verl with it"
    ) from exc

# the shared test helpers (credit_forests*, credit_reference*) live one folder up
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
