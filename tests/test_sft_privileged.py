"""``sft.privileged``: oracle steps also give rows whose prompt carries the env's
privileged text, rendered exactly as the teacher's prompts are, so that a model trained
from scratch can read the text its self-teacher will be shown."""

from __future__ import annotations

import pytest

from credo.teachers import privileged_prompt_ids
from credo.train.config import load_config
from credo.train.run import build_run
from credo.train.sft import collect_demonstrations
from credo.train.warmstart import _with_privileged


@pytest.fixture(scope="module")
def run():  # type: ignore[no-untyped-def]
    r = build_run(load_config("renyi_opsd", ["env.kwargs={difficulty: easy}"]))
    yield r
    r.close()


def _render(run):  # type: ignore[no-untyped-def]
    t = run.cfg.teacher
    return lambda instr, hist, obs, text: privileged_prompt_ids(
        run.renderer, instr, hist, obs, text, placement=t.placement, template=t.template
    )


def test_clean_demonstrations_give_one_privileged_row_per_step(run) -> None:  # type: ignore[no-untyped-def]
    plain = collect_demonstrations(run.make_env, run.renderer, episodes=3, epsilon=0.0, seed=4)
    demos = collect_demonstrations(
        run.make_env, run.renderer, episodes=3, epsilon=0.0, seed=4,
        privileged="oracle", privileged_prompt=_render(run),
    )  # fmt: skip
    # the demonstrations themselves do not change
    assert demos.rows() == plain.rows() and demos.success_rate == plain.success_rate == 1.0
    steps = [s for e in demos.episodes for s in e.steps]
    assert len(demos.privileged) == len(steps) > 0
    render = _render(run)
    for (prompt, response), step, (instr, hist, obs) in zip(
        demos.privileged, steps, _states(run, demos)
    ):
        assert response == step.response_ids  # the oracle's action, as in the plain row
        # the teacher's prompt of that state, with the oracle's next action: this action
        assert prompt == render(instr, hist, obs, step.action) != step.prompt_ids


def _states(run, demos):  # type: ignore[no-untyped-def]
    """Per step, the (instruction, history, observation) its prompt showed (``easy``
    shop: one goal per episode, the instruction after the reset)."""
    from credo.envs.base import Task
    from credo.rollout.group import read_instruction
    from credo.rollout.render import Turn

    out, env = [], run.make_env()
    for i, e in enumerate(demos.episodes):
        instruction = read_instruction(env, env.reset(Task.make("train", i), 0))
        hist: list = []
        for s in e.steps:
            out.append((instruction, list(hist), s.observation))
            hist.append(Turn(s.observation, s.action))
    return out


def test_noisy_steps_give_no_privileged_row(run) -> None:  # type: ignore[no-untyped-def]
    """A random action under a prompt that names the oracle's would teach the model to
    ignore the text: only oracle steps give privileged rows."""
    demos = collect_demonstrations(
        run.make_env, run.renderer, episodes=3, epsilon=1.0, seed=4,
        privileged="oracle", privileged_prompt=_render(run),
    )  # fmt: skip
    assert demos.privileged == []
    half = collect_demonstrations(
        run.make_env, run.renderer, episodes=6, epsilon=0.5, seed=4,
        privileged="oracle", privileged_prompt=_render(run),
    )  # fmt: skip
    steps = sum(len(e.steps) for e in half.episodes)
    assert 0 < len(half.privileged) < steps


def test_the_share_of_privileged_rows_added(run) -> None:  # type: ignore[no-untyped-def]
    demos = collect_demonstrations(
        run.make_env, run.renderer, episodes=4, epsilon=0.0, seed=4,
        privileged="oracle", privileged_prompt=_render(run),
    )  # fmt: skip
    n, p = len(demos.rows()), len(demos.privileged)
    cfg = load_config("renyi_opsd", ["sft.privileged=oracle", "sft.privileged_share=1"])
    assert len(_with_privileged(demos, cfg.sft)) == n + p
    cfg = load_config("renyi_opsd", ["sft.privileged=oracle", "sft.privileged_share=0.5"])
    rows = _with_privileged(demos, cfg.sft)
    assert n < len(rows) < n + p and rows[:n] == demos.rows()
    assert rows == _with_privileged(demos, cfg.sft)  # a fixed draw


def test_an_env_without_privileged_text_is_one_line(run) -> None:  # type: ignore[no-untyped-def]
    class Plain:  # the shop env, minus its privileged_context
        def __init__(self) -> None:
            self._env = run.make_env()

        def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
            if name == "privileged_context":
                raise AttributeError(name)
            return getattr(self._env, name)

    with pytest.raises(
        ValueError, match=r"sft.privileged=oracle but Plain has no privileged_context"
    ):
        collect_demonstrations(
            Plain, run.renderer, episodes=1, epsilon=0.0,
            privileged="oracle", privileged_prompt=lambda *a: [],
        )  # fmt: skip
