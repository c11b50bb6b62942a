"""pass@k and pass^k from n trials per task.

With ``c`` successes in ``n`` independent trials of a task, the unbiased estimates over
the draws of ``k ≤ n`` of those trials are

.. math::

    \\text{pass@}k = \\operatorname{E}_\\text{task}\\left[1 - \\binom{n-c}{k} \\Big/
    \\binom{n}{k}\\right] \\qquad
    \\text{pass}^k = \\operatorname{E}_\\text{task}\\left[\\binom{c}{k} \\Big/
    \\binom{n}{k}\\right]

pass@k: at least one of k trials succeeds (Chen et al. 2021, "Evaluating Large Language
Models Trained on Code", <https://arxiv.org/abs/2107.03374>); pass^k: all k succeed, the
reliability measure of τ-bench (Yao et al. 2024, <https://arxiv.org/abs/2406.12045>) and
CAST (``docs/algorithms.md#cast``). pass@1 = pass^1 = the mean success rate; pass@k
never decreases and pass^k never increases with k, and pass^k ≤ pass@k.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from math import comb

__all__ = ["check_ks", "parse_ks", "pass_at_k", "pass_hat_k"]


def check_ks(ks: Iterable[int], trials: int) -> tuple[int, ...]:
    """``ks`` as a sorted tuple of distinct values, each in 1..``trials``; otherwise a
    ``ValueError`` naming the bad k and the accepted range."""
    out = tuple(sorted(set(ks)))
    if trials < 1:
        raise ValueError(f"trials must be ≥ 1, got {trials}")
    for k in out:
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= trials:
            raise ValueError(
                f"k={k!r} needs k in 1..{trials} (the trials per task); raise --trials or lower k"
            )
    return out


def parse_ks(text: str) -> tuple[int, ...]:
    """``"1,2,4"`` → ``(1, 2, 4)``; a ``ValueError`` names a part that is not a positive
    integer."""
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or int(part) < 1:
            raise ValueError(f"--k takes positive integers like 1,2,4; got {part!r} in {text!r}")
        out.append(int(part))
    return tuple(out)


def _per_task(successes: Sequence[int], trials: int, k: int) -> None:
    check_ks([k], trials)
    bad = [c for c in successes if not 0 <= c <= trials]
    if bad:
        raise ValueError(f"successes per task must be in 0..{trials}, got {bad[0]}")


def pass_at_k(successes: Sequence[int], trials: int, k: int) -> float:
    """pass@k: the mean over tasks of 1 − C(n−c, k)/C(n, k).

    Args:
        successes: c per task [T], each in 0..n.
        trials: n, trials per task.
        k: 1..n.
    """
    _per_task(successes, trials, k)
    if not successes:
        return 0.0
    total = comb(trials, k)
    return sum(1 - comb(trials - c, k) / total for c in successes) / len(successes)


def pass_hat_k(successes: Sequence[int], trials: int, k: int) -> float:
    """pass^k: the mean over tasks of C(c, k)/C(n, k) (arguments as :func:`pass_at_k`)."""
    _per_task(successes, trials, k)
    if not successes:
        return 0.0
    total = comb(trials, k)
    return sum(comb(c, k) / total for c in successes) / len(successes)
