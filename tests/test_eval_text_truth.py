"""The held-out truth of the episodes' free text (``EvalResult.text_truth``: what a
judge's reward should raise), checked against the env's own verdict task by task, and
shown by ``credo compare`` where the env knows it."""

from __future__ import annotations

import torch

from credo.commands.compare import RecipeSummary, summary_table_rows
from credo.envs import Task
from credo.envs.tools import ToolsEnv, format_call
from credo.eval.evaluate import evaluate
from credo.policy import Generation, SamplingParams, build_word_tokenizer
from credo.rollout import PlainRenderer
from credo.rollout.render import PLAIN_WORDS

MESSAGE = "resolved : refund $ 30 for the camera ; bye"


class FixedAction:
    """Answers every prompt with one action."""

    def __init__(self, tokenizer, action: str) -> None:  # type: ignore[no-untyped-def]
        self.tokenizer, self.action = tokenizer, action

    def generate(self, prompts, sampling, generator=None):  # type: ignore[no-untyped-def]
        ids = [*self.tokenizer.encode(self.action, add_special_tokens=False),
               self.tokenizer.eos_token_id]  # fmt: skip
        return [Generation(ids, torch.full((len(ids),), -0.1), self.action, True) for _ in prompts]


def _eval(action: str, closing: str = "respond") -> tuple[float | None, list[float]]:
    def make() -> ToolsEnv:
        return ToolsEnv("easy", closing=closing, families=["refund_by_id"])

    tok = build_word_tokenizer([*make().vocabulary(), *PLAIN_WORDS])
    ev = evaluate(FixedAction(tok, action), PlainRenderer(tok), make, episodes=40,
                  sampling=SamplingParams(), max_turns=3)  # fmt: skip
    truths = []
    for i in range(40):  # the env's verdict on the same message, task by task
        env = make()
        env.reset(Task.make("test", i))
        truths.append(env.message_truth(MESSAGE))
    return ev.text_truth, truths


def test_text_truth_is_the_mean_of_the_envs_verdicts_on_the_messages_sent() -> None:
    got, truths = _eval(format_call("respond", {"message": MESSAGE}))
    assert 0 < sum(truths) < len(truths)  # some tasks refund $30 for a camera, most not
    assert got == sum(truths) / len(truths)
    # an episode that never sends a message counts 0 (done{} is not a message)
    assert _eval(format_call("done", {}))[0] == 0.0
    # an env whose episodes close without free text has no text truth
    assert _eval(format_call("done", {}), closing="done")[0] is None


def test_compare_adds_the_text_truth_column_where_an_env_knows_it() -> None:
    s = RecipeSummary("grpo", final=[0.5, 0.7], iteration_s=[1.0], update_s=[0.5],
                      text_truth=[0.5, 0.7])  # fmt: skip
    cols, rows = summary_table_rows([s, RecipeSummary("x", final=[0.1], iteration_s=[1.0],
                                                      update_s=[0.5])])  # fmt: skip
    assert cols[-1] == "held-out text truth (mean ± sd)"
    assert rows[0][-1] == "60.0% ± 14.1%" and rows[1][-1] == "—"
    plain = RecipeSummary("grpo", final=[0.5], iteration_s=[1.0], update_s=[0.5])
    assert "held-out text truth (mean ± sd)" not in summary_table_rows([plain])[0]
