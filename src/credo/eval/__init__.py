"""Evaluation: held-out success, confidence intervals, reports and plots."""

from credo.eval.evaluate import EvalResult, evaluate, wilson_interval

__all__ = ["EvalResult", "evaluate", "wilson_interval"]
