"""``credo pipeline FILE [--resume] [--quiet] [key.sub=value ...]``.

Reads and checks the whole pipeline first (:func:`~credo.pipeline.spec.load_pipeline`):
a wrong file, key, stage kind, reference or config value ends in one ``error:`` line
with exit status 2 before any compute. Then runs it (:func:`~credo.pipeline.runner.run_pipeline`),
one line per stage, and prints the summary table and the folder. Ctrl-C stops with the
command that resumes (exit status 130).
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from pathlib import Path

__all__ = ["main"]

_OVERRIDE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*=")


def _parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Run the stages of a pipeline file (sft, rl, internalise, eval, ...), "
        "each in its own folder, resumable per stage.",
        epilog="overrides: key.sub=value (every stage's config), stages.NAME.key.sub=value "
        "(one stage; stages.NAME.params.KEY=value for its params), name=NAME, runs_dir=DIR."
        "\n\nexamples:\n  credo pipeline pipelines/spatialcli.yaml\n"
        "  credo pipeline pipelines/spatialcli.yaml --resume\n"
        "  credo pipeline pipelines/spatialcli.yaml stages.rl_tools.train.iterations=5",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("file", metavar="FILE", help="the pipeline YAML file")
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue the pipeline's folder: skip finished stages, continue the others",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    return p


def main(argv: list[str], prog: str = "credo pipeline") -> int:
    """Run the command; returns the exit status (2: bad input, 130: interrupted)."""
    parser = _parser(prog)
    overrides = [a for a in argv if _OVERRIDE.match(a) and not Path(a).exists()]
    rest = [a for a in argv if a not in overrides]
    try:
        args = parser.parse_args(rest)
    except SystemExit as exc:
        return int(exc.code or 0)
    from credo.pipeline import PipelineError, StageInterrupted, load_pipeline, run_pipeline
    from credo.train.config import ConfigError
    from credo.utils.storage import storage_fix, storage_problem

    spec = None
    try:
        spec = load_pipeline(args.file, overrides)
        result = run_pipeline(spec, resume=args.resume, quiet=args.quiet, say=_say)
    except (KeyboardInterrupt, StageInterrupted) as exc:
        resume = shlex.join([*prog.split(), args.file, "--resume", *overrides])
        why = str(exc) if isinstance(exc, StageInterrupted) else "interrupted"
        print(f"{why}; continue with: {resume}", file=sys.stderr)
        return 130
    except (PipelineError, ConfigError, FileExistsError, FileNotFoundError, ValueError) as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    except Exception as exc:  # a full disk, a read-only folder: one line, not a traceback
        refused = storage_problem(exc)
        if refused is None:
            raise
        code, line = refused
        resume = shlex.join([*prog.split(), args.file, "--resume", *overrides])
        fix = storage_fix(code, spec.folder if spec is not None else Path(args.file).parent)
        print(
            f"error: {line}; finished stages are kept: {fix} and continue with: {resume}",
            file=sys.stderr,
        )
        return 2
    print((result.folder / "summary.md").read_text(), end="")
    print(f"pipeline folder: {result.folder}")
    return 0


def _say(line: str) -> None:
    print(line, flush=True)
