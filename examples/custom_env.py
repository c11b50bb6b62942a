"""A custom environment in about thirty lines: guess a secret number.

Check it, play it and train on it with no other change:

    credo check-env --env examples.custom_env:GuessEnv
    credo play --env examples.custom_env:GuessEnv
    credo train --env examples.custom_env:GuessEnv
    credo train --env examples.custom_env:guess                     # its registered name
    CREDO_ENV_MODULES=examples.custom_env credo train --env guess   # the name alone

(``@register_env("guess")`` registers the name when the module is imported: ``--env
module:name`` imports it, and so does ``$CREDO_ENV_MODULES``; an installed package
offers its envs by name through the ``credo.envs`` entry-point group.)

The protocol is five methods (reset, step, state_key, snapshot, restore). What they
must do:

- ``reset(task, seed)`` builds the episode from ``task.seed`` (``seed`` is always 0) and
  returns the first observation;
- ``step(action)`` returns a ``StepResult``: ``info["valid"]`` False for an action it
  does not understand (never raise), ``done`` True at the turn limit (``max_turns``) or
  when the task ends, and ``info["success"]`` on that last step;
- ``step`` receives the model's text detokenised: the built-in tokenizer splits words and
  the punctuation ``[ ] $ ; : , .`` and joins them with spaces, so ``guess[3]`` arrives
  as ``guess [ 3 ]``; the parser below splits on the brackets and accepts both.

The optional methods used here let credo warm-start the built-in model (oracle_action,
sample_action), give its tokenizer every word (vocabulary), show the goal on every
prompt (instruction) and give a teacher text the student never sees
(privileged_context: on-policy distillation with a privileged teacher), and describe a
task by its facts so that a chat model can write variants of it (task_spec, with reset
honouring ``task.data["spec"]``: RODS's ``llm`` synthesiser).
"""

import random

from credo.envs import StepResult, Task, register_env


@register_env("guess")
class GuessEnv:
    """Find a secret number in 1..high; each guess narrows the range shown."""

    def __init__(self, high: int = 8, max_turns: int = 4) -> None:
        self.high, self.max_turns = high, max_turns

    def reset(self, task: Task, seed: int = 0) -> str:
        spec = task.data.get("spec")  # optional: a task given by its facts (task_spec)
        if spec is not None and not (
            type(spec.get("secret")) is int and 1 <= spec["secret"] <= self.high
        ):
            raise ValueError(f"a guess task's spec is {{'secret': 1..{self.high}}}, got {spec!r}")
        self.secret = spec["secret"] if spec else random.Random(task.seed).randint(1, self.high)
        self.lo, self.hi, self.turn = 1, self.high, 0
        return self.observation()

    def instruction(self) -> str:
        return f"guess the secret number from 1 to {self.high}"

    def observation(self) -> str:
        return f"the secret is from {self.lo} to {self.hi}"

    def step(self, action: str) -> StepResult:
        self.turn += 1
        words = action.replace("[", " ").replace("]", " ").split()
        if len(words) != 2 or words[0] != "guess" or not words[1].isdigit():
            done = self.turn >= self.max_turns
            return StepResult(
                "invalid action : use guess[n] . " + self.observation(),
                0.0,
                done,
                {"valid": False, "success": False},
            )
        n = int(words[1])
        if n == self.secret:
            return StepResult("correct", 1.0, True, {"valid": True, "success": True})
        self.lo, self.hi = (
            (max(self.lo, n + 1), self.hi) if n < self.secret else (self.lo, min(self.hi, n - 1))
        )
        done = self.turn >= self.max_turns
        return StepResult(self.observation(), 0.0, done, {"valid": True, "success": False})

    def state_key(self) -> str:
        return f"{self.lo}-{self.hi}"

    def snapshot(self) -> tuple:
        return (self.secret, self.lo, self.hi, self.turn)

    def restore(self, snap: tuple) -> None:
        self.secret, self.lo, self.hi, self.turn = snap

    def oracle_action(self) -> str:  # optional: binary search
        return f"guess[{(self.lo + self.hi) // 2}]"

    def sample_action(self, rng: random.Random) -> str:  # optional: a random plausible move
        return f"guess[{rng.randint(self.lo, self.hi)}]"

    def task_spec(self) -> dict:  # optional: the facts of this task (RODS's llm synthesiser)
        return {"secret": self.secret}

    def privileged_context(self, kind: str) -> str | None:  # optional: a teacher's hint
        if kind == "oracle":
            return self.oracle_action()
        if kind == "solution":
            return f"the secret is {self.secret}"
        return None

    def vocabulary(self) -> list[str]:  # optional: words for the built-in tokenizer
        words = [
            "guess",
            "the",
            "secret",
            "number",
            "from",
            "1",
            "to",
            "is",
            "correct",
            "invalid",
            "action",
            ":",
            "use",
            "[",
            "]",
            "n",
            ".",
        ]
        return words + [str(i) for i in range(1, self.high + 1)]
