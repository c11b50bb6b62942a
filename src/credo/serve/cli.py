"""``python -m credo.serve MODEL`` (and the body of ``credo serve``): serve a policy folder.

``MODEL`` is anything :func:`credo.policy.models.resolve_model` accepts: a Hugging Face
model folder (a credo run's saved policy, the built-in model's included), a LoRA adapter
folder (its base model is loaded from the folder the adapter names), a credo alias such as
``smollm2-135m``, or a hub name. The API key, needed to bind anything but loopback, is
read from the ``CREDO_API_KEY`` environment variable (never from the command line, where
other users of the machine could read it).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import NoReturn

__all__ = ["add_serve_arguments", "build_parser", "cmd_serve", "main"]


def _int_in(lo: int, hi: int | None, what: str) -> Callable[[str], int]:
    """An argparse type: a whole number in ``[lo, hi]``, else one line saying so."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < lo or (hi is not None and value > hi):
            top = f"..{hi}" if hi is not None else " or more"
            raise argparse.ArgumentTypeError(
                f"{what} must be a whole number in {lo}{top}, got {text!r}"
            )
        return value

    return parse


def _temperature(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0.0 <= value <= 2.0:
        raise argparse.ArgumentTypeError(
            f"the temperature must be a number in [0, 2], got {text!r}"
        )
    return value


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    """The ``serve`` options, for ``python -m credo.serve`` and ``credo serve``."""
    p.add_argument("model", help="model folder, LoRA adapter folder, alias or hub name")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument(
        "--port",
        type=_int_in(0, 65535, "the port"),
        default=8000,
        help="port (default 8000; 0 = any free)",
    )
    p.add_argument("--device", default="cpu", help="torch device (default cpu)")
    p.add_argument("--name", default="credo", help="model id listed by /v1/models")
    p.add_argument(
        "--temperature",
        type=_temperature,
        default=None,
        help="sample every request at this temperature (default: each request's own)",
    )
    p.add_argument(
        "--max-batch",
        type=_int_in(1, None, "--max-batch"),
        default=64,
        help="sequences per batch (default 64)",
    )
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    p.add_argument(
        "--max-prompt-bytes",
        type=_int_in(1, None, "--max-prompt-bytes"),
        default=None,
        help="longest rendered prompt tokenised, in bytes (default: the context times the "
        "tokenizer's bytes per token; longer prompts get a 400 unread)",
    )
    p.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="another host name that means this server (Host/Origin checks without an API "
        "key); repeatable",
    )


def cmd_serve(args: argparse.Namespace) -> int:
    """Load ``args.model`` and serve it until interrupted (Ctrl-C)."""
    from credo.policy.hf import HFPolicy
    from credo.policy.models import ModelUnavailableError, model_problem, resolve_model
    from credo.serve.engine import EngineConfig
    from credo.serve.server import PolicyServer, check_bind

    api_key = os.environ.get("CREDO_API_KEY") or None
    try:
        check_bind(args.host, api_key)
        if problem := model_problem(args.model):
            raise ValueError(problem.replace("model.name=", "MODEL ").replace("--model", "MODEL"))
        policy = HFPolicy.from_pretrained(resolve_model(args.model), device=args.device)
    except (ValueError, OSError, ModelUnavailableError) as exc:  # one line, no traceback
        print(f"error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    try:
        server = PolicyServer(
            policy,
            host=args.host,
            port=args.port,
            api_key=api_key,
            engine=EngineConfig(
                max_batch=args.max_batch,
                temperature=args.temperature,
                max_prompt_bytes=args.max_prompt_bytes,
            ),
            seed=args.seed,
            model_name=args.name,
            record=False,  # nothing reads a standalone server's recordings
            allowed_hosts=set(args.allow_host),
        ).start()
    except (ValueError, RuntimeError, OSError) as exc:  # a port in use, say: one line
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    print(f"serving {args.model} at {server.base_url} (Ctrl-C stops)", file=sys.stderr)

    def _terminate(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _terminate)  # `kill PID` stops it as gracefully as Ctrl-C
    try:
        while True:
            time.sleep(1.0)
    except KeyboardInterrupt:
        pass
    finally:
        stopped = server.stop()
    print(f"stopped{'' if stopped else ' (threads still running)'}", file=sys.stderr)
    return 0


class _Parser(argparse.ArgumentParser):
    """Errors in one line (``error: PROG: ...``), exit status 2, no usage block."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {self.prog}: {message} (see `{self.prog} --help`)", file=sys.stderr)
        raise SystemExit(2)


def build_parser(prog: str = "python -m credo.serve") -> argparse.ArgumentParser:
    p = _Parser(
        prog=prog,
        description="an OpenAI-compatible chat-completions server for a credo policy",
    )
    add_serve_arguments(p)
    return p


def main(argv: list[str] | None = None, prog: str = "python -m credo.serve") -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``) and serve; ``prog`` names the command
    in help and errors (``--help`` and a bad option end in ``SystemExit``, as argparse's
    do: 0, or 2 after one ``error:`` line)."""
    return cmd_serve(build_parser(prog).parse_args(argv))
