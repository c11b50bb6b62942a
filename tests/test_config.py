"""Config loading, overrides and the errors users see."""

from __future__ import annotations

from pathlib import Path

import pytest

from credo.train.config import ConfigError, apply_overrides, load_config, recipe_names


def test_every_recipe_loads_and_validates() -> None:
    names = recipe_names()
    assert {"base", "grpo", "dr_grpo", "rloo"} <= set(names)
    for name in names:
        cfg = load_config(name)
        assert cfg.recipe == name


def test_overrides_are_typed() -> None:
    cfg = load_config(
        "grpo",
        [
            "optim.lr=1e-3",
            "rollout.group_size=4",
            "sft.enabled=false",
            "env.kwargs={difficulty: multi}",
            "credit.params.eps=0.01",
        ],
    )
    assert cfg.optim.lr == 1e-3 and isinstance(cfg.optim.lr, float)
    assert cfg.rollout.group_size == 4 and cfg.sft.enabled is False
    assert cfg.env.kwargs == {"difficulty": "multi"} and cfg.credit.params == {"eps": 0.01}


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "credit.estimator=gipo",
            "unknown estimator 'gipo'. Did you mean 'gigpo'? Valid estimator names: axpo,",
        ),
        ("objective.loss=pp", "Valid loss names: "),
        ("objective.aggregation=mean", "Valid aggregation names: "),
        (
            "optim.lrr=1",
            "unknown key 'optim.lrr'. Did you mean 'lr'? Valid keys: lr, lr_schedule, weight_decay",
        ),
        ("optim.lr=fast", "optim.lr: expected a number, got 'fast'"),
        ("rollout.group_size=0", "rollout.group_size must be ≥ 1"),
        ("sft.enabled=maybe", "expected true or false"),
        (
            "credit.params.gamma=0.9",
            "estimator 'grpo' has no parameter(s) 'gamma'. Accepted: norm_by_std, eps",
        ),
        ("env.name=nowhere", "unknown env 'nowhere'"),
        ("rollout.top_p=2", "rollout.top_p must be in (0, 1]"),
        ("noequals", "must look like key.sub=value"),
        ("objective.loss=ppo_rapo", "ppo_rapo needs tasks that carry a profile, and env 'shop'"),
        # checked at load, before any compute (they used to fail after the warm start)
        (
            "objective.aggregation_params={nrm: 2}",
            "objective.aggregation_params: aggregation 'token-mean' has no parameter(s) 'nrm'",
        ),
        (
            "rollout.train_tasks=1",
            "rollout.train_tasks=1 is smaller than rollout.tasks_per_iter=16",
        ),
        ("optim.betas=[2, 3]", "optim.betas must be two numbers in [0, 1)"),
        ("optim.betas=[0.9]", "optim.betas must be two numbers in [0, 1)"),
        ("optim.grad_clip=0", "optim.grad_clip must be > 0"),
        ("model.name=./no/such/folder", "model.name='./no/such/folder': no such folder"),
        ("model.device=tpu", "model.device must be cpu, cuda, cuda:N or auto"),
        ("env.name=credo.no_such_module:Env", "env.name='credo.no_such_module:Env'"),
    ],
)
def test_bad_input_says_what_is_valid(override: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config("grpo", [override])
    assert message in str(err.value)


def test_unknown_recipe_lists_the_valid_ones() -> None:
    with pytest.raises(ConfigError, match=r"unknown recipe 'grpoo'\. Did you mean 'grpo'"):
        load_config("grpoo")


def test_apply_overrides_does_not_mutate() -> None:
    base = {"a": {"b": 1}}
    out = apply_overrides(base, ["a.b=2", "a.c.d=[1, 2]"])
    assert base == {"a": {"b": 1}} and out == {"a": {"b": 2, "c": {"d": [1, 2]}}}


def test_warm_start_cache_key_follows_what_the_warm_start_depends_on() -> None:
    from credo.train.warmstart import warm_start_key

    base = warm_start_key(load_config("grpo"))
    assert base == warm_start_key(load_config("gigpo"))  # recipes share one warm start
    assert base == warm_start_key(load_config("grpo", ["optim.lr=1e-5", "train.iterations=3"]))
    for change in (
        "sft.steps=10",
        "train.seed=1",
        "env.kwargs={difficulty: multi}",
        "model.tiny.hidden_size=64",
        "rollout.history_turns=1",
    ):
        assert warm_start_key(load_config("grpo", [change])) != base, change
    # the built-in model's history: null means 3 past actions, and shares 3's warm start
    assert warm_start_key(load_config("grpo", ["rollout.history_turns=3"])) == base
    assert warm_start_key(load_config("grpo", ["rollout.history_turns=2"])) != base
    # the privileged-text settings count only when they are on
    assert warm_start_key(load_config("grpo", ["sft.privileged_share=0.25"])) == base
    on = warm_start_key(load_config("grpo", ["sft.privileged=oracle"]))
    assert on != base
    assert (
        warm_start_key(load_config("grpo", ["sft.privileged=oracle", "sft.privileged_share=1"]))
        != on
    )


def test_history_turns_default_is_three_past_actions_built_in_and_two_turns_for_llms() -> None:
    """``rollout.history_turns: null``: 3 for the built-in model (its prompt shows past
    actions only; with 2 an invalid ``choose`` and a ``back`` hid the ``click`` that opened
    an item on ``shop/multi``), 2 for HF chat models; a number is used as written, and
    the runs render with it."""
    from credo.train.run import build_run, history_turns

    cfg = load_config("grpo")
    assert cfg.rollout.history_turns is None
    assert history_turns(cfg, builtin=True) == 3 and history_turns(cfg, builtin=False) == 2
    two = load_config("grpo", ["rollout.history_turns=2"])
    assert history_turns(two, builtin=True) == 2 and history_turns(two, builtin=False) == 2
    tiny = [
        "sft.enabled=false",
        "model.tiny={hidden_size: 32, num_layers: 1, num_heads: 2, intermediate_size: 64}",
    ]
    for overrides, want in (([], 3), (["rollout.history_turns=1"], 1)):
        run = build_run(load_config("grpo", [*tiny, *overrides]))
        try:
            assert run.renderer.history_turns == want
        finally:
            run.close()


def test_warm_start_eval_cache_key_ignores_training_only_rollout_settings() -> None:
    """The warm start's held-out evaluation is cached by what it reads: a run that
    changes only how training samples (tasks per iteration, group size, the sampler, KLPO's
    draws, oracle continuations) reuses it instead of spending minutes re-evaluating the
    same policy on the same tasks; anything the evaluation reads changes the key."""
    from credo.train.warmstart import eval_cache_name

    def name(*overrides: str) -> str:
        return eval_cache_name(load_config("grpo", list(overrides)), "k", builtin=True)

    base = name()
    for same in (
        "rollout.tasks_per_iter=16",
        "rollout.group_size=8",
        "rollout.sampler=tree",
        "rollout.train_tasks=500",
        "rollout.invalid_penalty=0.1",
        "rollout.aux_samples=2",
        "rollout.oracle_horizon=2",
        "rollout.env_workers=2",
        "optim.lr=1e-5",
        "credit.estimator=gigpo",
        "rollout.history_turns=3",  # what null means for the built-in model
    ):
        assert name(same) == base, same
    for changed in (
        "rollout.temperature=0.7",
        "rollout.top_p=0.9",
        "rollout.max_new_tokens=12",
        "rollout.history_turns=1",
        "rollout.max_turns=3",
        "rollout.system_prompt=hi",
        "rollout.step_timeout=5",
        "eval.episodes=50",
        "eval.seed=1",
    ):
        assert name(changed) != base, changed
    assert eval_cache_name(load_config("grpo"), "other", builtin=True) != base


def test_warm_start_eval_cache_key_follows_the_agents_code(tmp_path: Path) -> None:
    """An agent run's warm start is evaluated through the agent: editing the agent's
    file (or a module beside it) in place, under the same ``--agent`` name, must not
    find the evaluation of the old code."""
    pytest.importorskip("openai")
    pytest.importorskip("fastapi")
    from credo.train.warmstart import eval_cache_name

    agent, helper = tmp_path / "keyed_agent.py", tmp_path / "keyed_helper.py"
    helper.write_text("REWARD = 1.0\n")

    def name() -> str:
        cfg = load_config("grpo", [f"rollout.agent={agent}:run"])
        return eval_cache_name(cfg, "k", builtin=True)

    agent.write_text("def run(task, client, session_id):\n    return 1.0\n")
    first = name()
    assert name() == first  # the same code: the same key
    agent.write_text("def run(task, client, session_id):\n    return 0.0\n")
    edited = name()
    assert edited != first
    helper.write_text("REWARD = 0.0\n")
    assert name() not in (first, edited)


def test_sft_steps_default_to_what_the_env_asks_for() -> None:
    """``sft.steps: null`` is the env's ``sft_steps`` (``tools``: 6000) or 2500, and the
    warm-start key holds the resolved number: the warm starts cached before the default
    became env-dependent keep their keys."""
    from credo.train.warmstart import sft_steps, warm_start_key

    shop, tools = load_config("grpo"), load_config("grpo", ["env.name=tools"])
    assert shop.sft.steps is None and (sft_steps(shop), sft_steps(tools)) == (2500, 6000)
    assert sft_steps(load_config("grpo", ["env.name=tools", "sft.steps=300"])) == 300
    assert warm_start_key(shop) == warm_start_key(load_config("grpo", ["sft.steps=2500"]))
    assert warm_start_key(tools) == warm_start_key(
        load_config("grpo", ["env.name=tools", "sft.steps=6000"])
    )
    assert warm_start_key(tools) != warm_start_key(
        load_config("grpo", ["env.name=tools", "sft.steps=2500"])
    )
    # an env without the attribute (a third-party adapter, your own) gets 2500
    assert sft_steps(load_config("grpo", ["env.name=examples.custom_env:GuessEnv"])) == 2500


def test_a_cuda_device_without_cuda_is_refused_at_load() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    with pytest.raises(ConfigError, match=r"model\.device=cuda but this torch build sees no CUDA"):
        load_config("grpo", ["model.device=cuda"])


def test_machine_false_checks_everything_but_this_machine(tmp_path: Path) -> None:
    """``load_config(machine=False)`` (a study index built in credo's own venv) accepts
    an engine this venv cannot run and a device it lacks, set by overrides or by a recipe
    file, and still refuses the settings the engine refuses."""
    from credo.policy.engine import engine_problem

    if engine_problem("vllm") is None:
        pytest.skip("vLLM runs here: nothing about this machine to skip")
    with pytest.raises(ConfigError, match="vllm"):
        load_config("grpo", ["rollout.engine=vllm"])
    assert load_config("grpo", ["rollout.engine=vllm"], machine=False).rollout.engine == "vllm"
    recipe = tmp_path / "sampled_by_vllm.yaml"
    recipe.write_text("inherit: grpo\nrollout: {engine: vllm}\n")
    assert load_config(str(recipe), machine=False).rollout.engine == "vllm"
    with pytest.raises(ConfigError, match=r"rollout\.engine=vllm needs rollout\.top_p=1"):
        load_config("grpo", ["rollout.engine=vllm", "rollout.top_p=0.9"], machine=False)
    with pytest.raises(ConfigError, match="engine_params"):
        load_config(
            "grpo", ["rollout.engine=vllm", "rollout.engine_params={nope: 1}"], machine=False
        )
    import torch

    if not torch.cuda.is_available():
        assert load_config("grpo", ["model.device=cuda"], machine=False).model.device == "cuda"
    # the switch is scoped to the call: the next load checks the machine again
    with pytest.raises(ConfigError, match="vllm"):
        load_config("grpo", ["rollout.engine=vllm"])


def test_a_recipe_with_a_yaml_syntax_error_names_the_file_and_line(tmp_path) -> None:  # type: ignore[no-untyped-def]
    bad = tmp_path / "bad.yaml"
    bad.write_text("inherit: base\nrollout: {group_size: 4\n")
    with pytest.raises(ConfigError, match=r"recipe .*bad\.yaml \(line \d+, column \d+\)"):
        load_config(str(bad))


def test_a_loss_registers_its_requirements_not_an_aggregation() -> None:
    from credo.objectives import (
        LOSSES,
        loss_env_features,
        loss_is_advantage_weighted,
        loss_needs,
        loss_ratio_level,
        loss_requirements,
        loss_teacher_requirements,
    )

    meta = {"requires", "teacher", "env_features", "advantage_weighted", "needs"}
    for name in LOSSES.names():  # the old `aggregation=` meta contradicted the recipes
        assert set(LOSSES.meta(name)) == meta, name
    weighted = {n for n in LOSSES.names() if loss_is_advantage_weighted(n)}
    assert weighted == {"ppo", "holder", "holder_token", "ppo_rapo"}
    assert {n for n in LOSSES.names() if loss_env_features(n)} == {"ppo_rapo"}
    teacher_losses = {n for n in LOSSES.names() if loss_teacher_requirements(n) is not None}
    assert teacher_losses == {"opd", "mt_sdpo", "renyi_opsd"}
    # what the trainer prepares for a loss: asked of the registry, never by its name
    needs = {n: set(loss_needs(n)) for n in LOSSES.names() if loss_needs(n)}
    assert needs == {
        "renyi_opsd": {"reference", "reference_head"},
        "ppo_rapo": {"reference", "profile_reference"},
    }
    # the ratio level the update's statistics use: the loss's knob, else token
    assert loss_ratio_level("ppo", {"ratio_level": "sequence"}) == "sequence"
    assert loss_ratio_level("ppo", {}) == "token"
    assert loss_ratio_level("klpo", {}) == "token"
    cfg = load_config("klpo")
    assert loss_requirements("klpo")(cfg.objective.params, cfg.rollout) is None
    assert loss_requirements("ppo")({}, cfg.rollout) is None


def test_sft_seed_lets_rl_runs_of_several_seeds_share_one_warm_start() -> None:
    """``sft.seed`` (default: ``train.seed``) is what the warm start and its key read: the
    built-in model's initial weights, the demonstrations and the SFT shuffles. The keys of
    warm starts made before it existed do not change."""
    import torch

    from credo.train.run import build_run
    from credo.train.warmstart import warm_start, warm_start_key

    tiny = [
        "env.name=examples.custom_env:GuessEnv",
        "model.tiny={hidden_size: 32, num_layers: 1, num_heads: 2, intermediate_size: 64}",
        *("sft.episodes=20", "sft.noisy_episodes=10", "sft.steps=3", "sft.noisy_steps=2"),
        "sft.cache=false",
        "train.threads=1",
    ]
    base = load_config("grpo", tiny)
    assert base.sft.seed is None and base.warm_start_seed == 0
    rl_seed_1 = load_config("grpo", [*tiny, "train.seed=1", "sft.seed=0"])
    own_seed_1 = load_config("grpo", [*tiny, "train.seed=1"])
    assert warm_start_key(rl_seed_1) == warm_start_key(base)
    assert warm_start_key(load_config("grpo", [*tiny, "sft.seed=0"])) == warm_start_key(base)
    assert warm_start_key(own_seed_1) != warm_start_key(base)
    assert warm_start_key(own_seed_1) == warm_start_key(load_config("grpo", [*tiny, "sft.seed=1"]))

    def weights(cfg):  # type: ignore[no-untyped-def]
        run = build_run(cfg)
        try:
            policy, _ = warm_start(run)
        finally:
            run.close()
        return [p.detach().clone() for p in policy.model.parameters()]

    made = weights(base)
    assert all(torch.equal(a, b) for a, b in zip(made, weights(rl_seed_1)))
    assert not all(torch.equal(a, b) for a, b in zip(made, weights(own_seed_1)))
    with pytest.raises(ConfigError, match=r"sft\.seed must be ≥ 0, got -1"):
        load_config("grpo", ["sft.seed=-1"])


@pytest.mark.parametrize("name", ["../../x", "/tmp/abs", ".", "..", "a/b", ".hidden", "-x", ""])
def test_run_names_are_folder_names_not_paths(name: str, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    """Issue 46, item 4: ``train.name=../../x``, an absolute path or ``.`` wrote outside
    ``runs/``; a run name is now one folder name, refused in one line before anything."""
    from credo.cli import main

    with pytest.raises(ConfigError, match=r"train\.name=.* must be one folder name"):
        load_config("grpo", [f"train.name={name!r}"])
    runs = tmp_path / "deep" / "runs"
    code = main(["train", f"train.name={name!r}", f"train.runs_dir={runs}", "--iterations", "1"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "must be one folder name" in err
    assert list(tmp_path.rglob("*")) == []  # nothing written, inside runs_dir or out


@pytest.mark.parametrize("name", ["grpo-seed0", "grpo.v2-seed1", "renyi_opsd-plain", "7"])
def test_ordinary_run_names_are_accepted(name: str) -> None:
    assert load_config("grpo", [f"train.name={name!r}"]).train.name == name


def test_a_temperature_too_small_to_divide_by_is_refused() -> None:
    """Logits divided by 1e-308 overflow to inf and the sampling distribution to NaN
    (found by the hostile-input suite's fuzzer, issue 46); 0 is greedy."""
    with pytest.raises(ConfigError, match=r"rollout\.temperature must be 0 \(greedy\) or at"):
        load_config("grpo", ["rollout.temperature=1e-308"])
    assert load_config("grpo", ["rollout.temperature=0"]).rollout.temperature == 0
    assert load_config("grpo", ["rollout.temperature=0.001"]).rollout.temperature == 0.001
