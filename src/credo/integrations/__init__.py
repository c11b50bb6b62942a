"""Bridges from credo to other training engines.

Each engine's module imports that engine and fails with a one-line ``ImportError`` when it
is missing; the engine-independent parts (batch mapping, loss adapters) live in their own
modules so that they can be used and tested without it:

- :mod:`credo.integrations.verl_batch`: a verl / verl-agent batch ↔ :class:`RolloutForest`.
- :mod:`credo.integrations.verl_loss`: credo's policy losses on verl's loss tensors.
- :mod:`credo.integrations.verl`: registers both with verl (needs ``verl``).
"""
