"""The small training run the integration tests share.

On ``examples.custom_env:GuessEnv`` with a 64-wide built-in model, this warm start solves
about a third of the tasks, so groups mix successes and failures and every iteration has
signal (non-zero advantages and gradients). The warm start is the same for every test
that uses :data:`WARM` (one config hash), so the session cache trains it once.

The prompt keeps two past actions (``rollout.history_turns=2``), the built-in model's
default before 2026-12-07, under which these runs were calibrated. With three (CI,
2026-12-07), MT-SDPO's first two iterations had no failed group, so its teacher pool was
never consulted, and the reward-routed OPD students ended 0.22 and 0.12 from their
teacher against 0.55 and 0.38 without its reward, short of the 4x the teacher test
asks. The default itself is pinned by ``tests/test_config.py`` and the golden case
``grpo-history-default``.
"""

#: The env, the model and its warm start.
WARM = [
    "env.name=examples.custom_env:GuessEnv",
    "model.tiny={hidden_size: 64, num_layers: 2, num_heads: 4, intermediate_size: 128}",
    "sft.episodes=600",
    "sft.steps=120",
    "sft.noisy_episodes=200",
    "sft.noisy_steps=20",
    "sft.epsilon=0.5",
    "rollout.max_new_tokens=6",
    "rollout.history_turns=2",
    "train.threads=1",
]

#: :data:`WARM` plus a small RL iteration (4 tasks × 4 episodes) and a 16-task evaluation.
SMALL = [
    *WARM,
    "rollout.tasks_per_iter=4",
    "rollout.group_size=4",
    "optim.lr=5e-4",
    "eval.episodes=16",
]

#: The smallest run the CLI and run-folder tests share: no warm start, one group of two
#: episodes per task on two tasks (add ``train.iterations=N``).
TINY_RUN = [
    "env.name=examples.custom_env:GuessEnv",
    "model.tiny={hidden_size: 32, num_layers: 1, num_heads: 2, intermediate_size: 64}",
    "sft.enabled=false",
    "rollout.tasks_per_iter=2",
    "rollout.group_size=2",
    "rollout.max_new_tokens=4",
    "eval.episodes=4",
    "train.threads=1",
]
