"""``credo compare``'s recipe-scoped overrides: ``RECIPE:key=value`` reaches that recipe
only, so a teacher recipe can be compared with GRPO in one command."""

from __future__ import annotations

import pytest

from credo.cli import parse_args
from credo.commands.compare import split_overrides
from credo.train.config import ConfigError, load_config


def test_plain_overrides_reach_every_recipe_and_scoped_ones_only_theirs() -> None:
    got = split_overrides(
        ["grpo", "opd", "recipes/mine.yaml"],
        [
            "train.iterations=5",
            "opd:teacher.path=/runs/t",
            "mine:optim.lr=1e-3",
            "env.kwargs={a: 1}",
        ],
    )
    assert got == {
        "grpo": ["train.iterations=5", "env.kwargs={a: 1}"],
        "opd": ["train.iterations=5", "teacher.path=/runs/t", "env.kwargs={a: 1}"],
        "recipes/mine.yaml": ["train.iterations=5", "optim.lr=1e-3", "env.kwargs={a: 1}"],
    }


def test_a_scoped_override_for_a_recipe_not_compared_is_one_line() -> None:
    with pytest.raises(
        ConfigError, match=r"recipe 'gigpo', which is not compared; compared: grpo, opd"
    ):
        split_overrides(["grpo", "opd"], ["gigpo:teacher.path=/x"])


def test_a_colon_in_the_value_is_not_a_scope() -> None:
    assert split_overrides(["grpo"], ["env.kwargs={difficulty: multi}"]) == {
        "grpo": ["env.kwargs={difficulty: multi}"]
    }


def test_the_cli_collects_scoped_overrides_and_train_refuses_them_in_one_line() -> None:
    args = parse_args(["compare", "--recipes", "grpo,opd", "opd:teacher.path=/t", "--seeds", "1"])
    assert "opd:teacher.path=/t" in args.overrides
    with pytest.raises(
        ConfigError, match=r"applies to one recipe of a `credo compare`; here write teacher.path=/t"
    ):
        load_config("grpo", ["opd:teacher.path=/t"])


def test_scoped_teacher_settings_load_for_their_recipe_and_leave_grpo_alone(tmp_path) -> None:
    """Before scoping, ``teacher.path`` for ``opd`` reached ``grpo`` too, which refuses a
    teacher path without a teacher kind: the pair could not be compared in one command."""
    (tmp_path / "config.json").write_text("{}")  # a model folder, as far as loading checks
    plain = ["teacher.path=" + str(tmp_path)]
    with pytest.raises(ConfigError, match=r"teacher\.kind is null"):
        load_config("grpo", plain)
    scoped = split_overrides(["grpo", "opd"], ["opd:teacher.path=" + str(tmp_path)])
    assert load_config("grpo", scoped["grpo"]).teacher.path is None
    assert load_config("opd", scoped["opd"]).teacher.path == str(tmp_path)


def test_recipes_on_different_envs_are_refused_before_any_run(tmp_path) -> None:
    """``rapo`` names its own env (``tools`` with profiles); compared with ``grpo`` (on
    ``shop``) without one env for both, the two success rates would not compare."""
    from credo.commands.compare import compare

    out = tmp_path / "cmp"
    with pytest.raises(
        ConfigError,
        match=r"different envs \(grpo on shop \{\}, rapo on tools \{'profiles': True\}\): "
        r"set one env for all with --env NAME and env.kwargs=",
    ):
        compare(["grpo", "rapo"], [0], out_dir=out)
    assert not out.exists()
    with pytest.raises(ConfigError, match=r"different envs \(grpo on tools \{\}, rapo on tools"):
        compare(["grpo", "rapo"], [0], overrides=["env.name=tools"], out_dir=out)
    # the same kwargs written in another order are the same env
    from credo.commands.compare import _check_one_env

    _check_one_env(
        ["grpo", "rapo"],
        [
            load_config(
                "grpo", ["env.name=tools", "env.kwargs={difficulty: easy, profiles: true}"]
            ),
            load_config("rapo", ["env.kwargs.difficulty=easy"]),
        ],
    )
    # one env for all: the configs load (checked here without training)
    same = ["env.name=tools", "env.kwargs={profiles: true}"]
    assert load_config("grpo", same).env == load_config("rapo", same).env
