"""credo: credit assignment for multi-turn LLM agents trained with RL."""

import os as _os

# Idle OpenMP threads sleep instead of spinning, so that one run's threads do not take the
# CPU from another's on shared cores (credo.utils.threads). Read by OpenMP when torch is
# first imported: credo sets it before that, unless the user chose a policy.
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
