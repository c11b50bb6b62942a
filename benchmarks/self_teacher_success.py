"""How well does a self-teacher act? Held-out success of a policy with and without the
env's privileged text in its prompt.

A self-teacher (Rényi OPSD's, ``teacher.kind: self``) is the student reading text the
student does not see (``teacher.privileged``, e.g. the oracle's next action). On-policy
self-distillation pulls the student toward that teacher, so the teacher's own success,
acting with the text, bounds what distillation alone can give. This evaluates a policy
(the recipe's warm start, or ``--policy``: a run's ``final_policy``) on the same held-out
tasks twice, sampled as the trainer evaluates: as the student, and as its self-teacher
(the text put into the goal exactly as the teacher's prompts have it, ``teacher.placement:
instruction`` and ``teacher.template``; the env is asked for the text at every step).

    python benchmarks/self_teacher_success.py --recipe renyi_opsd --env gym:credo/TextLights-v0 \\
        "env.kwargs={make_kwargs: {min_lamps: 6, max_lamps: 9, max_episode_steps: 11}}" ...
    python benchmarks/self_teacher_success.py ... --policy RUN/final_policy
"""

from __future__ import annotations

import argparse
from typing import Any

import _common  # noqa: F401  (puts the repository root on sys.path)
from _common import print_table, warm_policy

from credo.eval.evaluate import evaluate
from credo.train.config import load_config


class ReadsText:
    """``env`` whose goal carries its privileged text of ``kind``, as a self-teacher's
    prompt does (placement ``instruction``); every other attribute is the env's."""

    def __init__(self, env: Any, kind: str, template: str) -> None:
        self._env, self._kind, self._template = env, kind, template

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)

    def instruction(self) -> str:
        goal = self._env.instruction()
        text = self._env.privileged_context(self._kind)
        return self._template.format(text=goal, privileged=text) if text else goal


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipe", default="renyi_opsd")
    ap.add_argument("--env", default="shop", help="env name (default shop)")
    ap.add_argument("--seed", type=int, default=0, help="training seed (its warm start)")
    ap.add_argument("--policy", help="a policy folder to measure instead of the warm start")
    ap.add_argument("--episodes", type=int, default=200, help="held-out tasks (default 200)")
    ap.add_argument("overrides", nargs="*", help="key=value overrides")
    args = ap.parse_intermixed_args()
    cfg = load_config(
        args.recipe,
        [f"env.name={args.env}", "train.threads=1", f"train.seed={args.seed}", *args.overrides],
    )
    t = cfg.teacher
    if t.privileged in (None, "anchor") or t.placement != "instruction":
        raise SystemExit(
            f"recipe {args.recipe}: its teacher reads no env text in the goal "
            f"(teacher.privileged={t.privileged}, placement={t.placement})"
        )
    run, policy = warm_policy(cfg, args.policy)
    try:
        if not callable(getattr(run.make_env(), "privileged_context", None)):
            raise SystemExit(f"env {args.env} offers no privileged_context")

        def reading() -> ReadsText:
            return ReadsText(run.make_env(), str(t.privileged), t.template)

        rows = []
        for name, make in (("student (plain goal)", run.make_env), ("self-teacher", reading)):
            res = evaluate(
                policy, run.renderer, make, episodes=args.episodes, sampling=run.sampling,
                max_turns=run.max_turns, seed=cfg.eval.seed,
            )  # fmt: skip
            rows.append(
                [name, res.episodes, f"{res.success_rate:.1%}",
                 f"{res.ci_low:.1%}–{res.ci_high:.1%}", f"{res.invalid_rate:.1%}"]
            )  # fmt: skip
    finally:
        run.close()
    print_table(
        f"held-out success acting as the student and as its self-teacher reading "
        f"{t.privileged!r} ({args.env}, seed {args.seed}, {args.policy or 'warm start'})",
        ["policy acts as", "episodes", "success", "95 % interval", "invalid"],
        rows,
        width=140,
    )


if __name__ == "__main__":
    main()
