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


@pytest.mark.slow
def test_privileged_steps_teach_reading_first(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """``sft.privileged_steps``: a phase on the text rows alone comes before the clean
    phase (reported first, counted in the total), and the model then gives the oracle's
    action more probability with the text than without it. On TextLights with the 64-wide
    model, mixed in from the start the text did not help at all (log p −1.08 with it,
    −1.05 without, 1000 steps at share 1)."""
    import torch

    from credo.train.warmstart import warm_start

    monkeypatch.setenv("CREDO_CACHE", str(tmp_path))
    overrides = [
        "env.name=gym:credo/TextLights-v0",
        "env.kwargs={make_kwargs: {min_lamps: 6, max_lamps: 9, max_episode_steps: 11}}",
        "model.tiny={hidden_size: 64, num_layers: 2, num_heads: 4, intermediate_size: 128}",
        "sft.episodes=150", "sft.steps=20", "sft.noisy_episodes=0", "sft.noisy_steps=0",
        "sft.privileged_steps=200", "sft.privileged_share=1.0", "train.threads=2",
    ]  # fmt: skip
    r = build_run(load_config("renyi_opsd", overrides))
    try:
        phases: list[tuple[str, int, int]] = []
        policy, _ = warm_start(r, on_step=lambda ph, i, n, loss: phases.append((ph, i, n)))
        names = list(dict.fromkeys(p for p, _, _ in phases))
        assert names == ["text demos", "clean demos"]
        assert phases[0][2] == 220 and sum(p == "text demos" for p, _, _ in phases) == 200
        assert phases[-1][1] == 220
        held = collect_demonstrations(
            r.make_env, r.renderer, episodes=20, epsilon=0.0, first_task=5000,
            privileged="oracle", privileged_prompt=_render(r),
        )  # fmt: skip
        plain = [p for p, _ in held.rows()]
        read = [(p, resp) for p, resp in held.privileged]
        assert len(plain) == len(read) > 0
        assert [resp for _, resp in held.rows()] == [resp for _, resp in read]

        def mean_logp(rows: list[tuple[list[int], list[int]]]) -> float:
            total = 0.0
            for prompt, resp in rows:
                ids = torch.tensor([prompt + resp])
                with torch.no_grad():
                    out = policy.score(ids, torch.ones_like(ids))
                total += float(out.logprobs[0, len(prompt) :].sum())
            return total / len(rows)

        with_text = mean_logp(read)
        without = mean_logp([(p, resp) for p, (_, resp) in zip(plain, read)])
        assert with_text > without + 0.3, (with_text, without)  # here: -0.64 vs -1.31
    finally:
        r.close()


def test_anchor_rows_carry_the_sanitised_successful_episode() -> None:
    """``sft.privileged=anchor``: each oracle step of a successful demonstration also
    gives a row whose prompt carries that episode's sanitised actions, as MT-SDPO's
    teacher reads them (an episode whose sanitised text is empty gives none)."""
    from credo.rollout.render import Turn
    from credo.teachers.sanitise import sanitise

    cfg = load_config(
        "mt_sdpo", ["env.name=examples.custom_env:GuessEnv", "teacher.sanitiser=drop_final"]
    )
    r = build_run(cfg)
    try:

        def anchor(actions: list[str]) -> str:
            return sanitise("drop_final", actions)

        demos = collect_demonstrations(
            r.make_env, r.renderer, episodes=6, epsilon=0.0, seed=3,
            privileged="anchor", privileged_prompt=_render(r), anchor=anchor,
        )  # fmt: skip
        assert demos.success_rate == 1.0
        instruction = r.make_env().instruction()
        want = []
        for e in demos.episodes:
            text = anchor([s.action for s in e.steps])
            history: list[Turn] = []
            for s in e.steps:
                if text:
                    prompt = _render(r)(instruction, list(history), s.observation, text)
                    want.append((prompt, s.response_ids))
                history.append(Turn(s.observation, s.action))
        assert len(want) > 0 and demos.privileged == want
        assert any(len(e.steps) > 1 for e in demos.episodes)
        with pytest.raises(ValueError, match="needs the sanitiser"):
            collect_demonstrations(
                r.make_env, r.renderer, episodes=1, epsilon=0.0,
                privileged="anchor", privileged_prompt=_render(r),
            )  # fmt: skip
    finally:
        r.close()


def test_the_warm_start_key_follows_how_the_text_is_rendered() -> None:
    """The privileged rows are rendered as the teacher's prompts are: the placement, the
    template and, for anchors, the sanitiser enter the warm start's key; without
    ``sft.privileged`` they do not (warm starts of other recipes keep their keys)."""
    from credo.train.warmstart import warm_start_key

    def key(*extra: str) -> str:
        return warm_start_key(load_config("mt_sdpo", ["sft.steps=10", *extra]))

    anchor = ["sft.privileged=anchor"]
    assert key(*anchor) != key(*anchor, "teacher.sanitiser=drop_final")
    assert key(*anchor) != key(*anchor, "teacher.template='{privileged} ; {text}'")
    assert key() == key("teacher.sanitiser=drop_final")  # no privileged rows: same start
    oracle = ["env.name=examples.custom_env:GuessEnv", "sft.privileged=oracle"]
    assert key(*oracle) != key(*oracle, "teacher.placement=observation")
    assert key(*oracle) == key(*oracle, "teacher.sanitiser=drop_final")  # no anchors
