"""Envs with faults for ``tests/test_ray_envs.py``, in a module of their own: Ray's env
workers import it, and it imports nothing heavy (a worker that imported the test module
would load torch and the trainer: seconds per actor start)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from examples.custom_env import GuessEnv

from credo.envs import Task


class FaultyGuess(GuessEnv):
    """:class:`GuessEnv` whose ``step`` at turn ``turn`` of task seed ``seed`` hangs for
    ``hang_s`` seconds: once (the first process to remove the file ``flag`` hangs) or,
    without ``flag``, every time. A hang that runs to its end writes the file ``woke``
    (when given): a pool that cuts the hang short returns before that file exists."""

    def __init__(
        self, seed: int = 1, turn: int = 2, hang_s: float = 60.0, flag: str = "", woke: str = ""
    ) -> None:
        super().__init__()
        self.fault_seed, self.fault_turn, self.hang_s, self.flag = seed, turn, hang_s, flag
        self.woke = woke

    def _hang(self) -> None:
        time.sleep(self.hang_s)
        if self.woke:
            Path(self.woke).write_text("the hang ran to its end")

    def step(self, action: str) -> Any:
        if self.secret_seed == self.fault_seed and self.turn + 1 == self.fault_turn:
            if not self.flag:
                self._hang()
            else:
                try:
                    os.remove(self.flag)
                except FileNotFoundError:
                    pass
                else:
                    self._hang()
        return super().step(action)

    def reset(self, task: Task, seed: int = 0) -> str:
        self.secret_seed = task.seed
        return super().reset(task, seed)
