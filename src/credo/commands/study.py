"""Studies: a paper's comparison, or a question about credo, as a file anyone can re-run.

A study is a YAML file (``studies/<name>.yaml``) naming what is tested and how::

    title: "Several optimizer steps per batch"
    paper: "PPO (Schulman et al., 2017), https://arxiv.org/abs/1707.06347"
    claim: "reusing each batch for several clipped steps learns more per sample"
    env: shop                                  # --env of every run
    overrides: [env.kwargs.difficulty=multi]   # key=value for every arm
    iterations: 100
    seeds: 3                                   # 0, 1, 2 (or a list)
    reference: 1x1                             # the arm the others are measured against
    arms:
      - {name: 1x1, recipe: grpo, overrides: [optim.epochs=1, optim.minibatches=1]}
      - {name: 1x4, recipe: grpo, overrides: [optim.minibatches=4]}
    setup:                      # optional: runs the arms need (a teacher), trained first
      - {name: teacher, recipe: grpo, overrides: [train.iterations=20]}
    # an arm names a setup run as {setup}/NAME, quoted: "teacher.path={setup}/teacher"
    verdict: pending            # reproduced in kind | not reproduced | mixed | pending
    why: ""                     # one line: the numbers that decide the verdict
    result: ""                  # one line: credo's result, for the index
    notes: ""                   # markdown under the table: readings, diagnostics

An arm may instead name a pipeline file (``{name: spatialcli, pipeline:
pipelines/spatialcli.yaml}``, all arms alike): each runs once per seed and the table has
every stage that measured held-out success (:mod:`credo.pipeline.study`).

``credo study studies/<name>.yaml [--jobs 2]`` trains the setup runs (each once, with the
study's overrides and its own, into the study's run folder), then every arm with every seed
through
:func:`credo.commands.compare.compare` (the same tasks and budget, one warm start per seed,
resumable: run it again after a stop), then writes ``docs/studies/<name>.md`` (the
study's setup, the exact command, the table, the plot, the verdict and notes) and the
index ``docs/studies/README.md`` (one row per study file beside it). Each finished run is
recorded in ``studies/records/<name>/`` (``--records``; :mod:`credo.commands.records`), and
a run recorded with the same config is read from its record instead of being trained, so a
study of more runs than one session holds continues in the next. The verdict, its
reason and the notes are written by a person into the study file after reading the
results; the command only copies them.
"""

from __future__ import annotations

import json
import shlex
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from credo.commands.compare import Arm, RecipeSummary, _run_one, compare
from credo.commands.records import record_commits, record_cpus
from credo.train.config import ConfigError
from credo.utils.atomic import write_text_atomic
from credo.utils.markdown import markdown_table
from credo.utils.safe_yaml import read_yaml_file, yaml_problem

__all__ = [
    "VERDICTS",
    "PipelineArm",
    "Study",
    "load_study",
    "run_study",
    "write_index",
    "write_page",
]

#: the verdicts a study may carry
VERDICTS = ("reproduced in kind", "not reproduced", "mixed", "pending", "answered")

_KEYS = {
    "title",
    "paper",
    "claim",
    "env",
    "overrides",
    "iterations",
    "seeds",
    "reference",
    "arms",
    "verdict",
    "why",
    "result",
    "notes",
    "setup",
}
_ARM_KEYS = {"name", "recipe", "overrides"}
#: An arm may name a pipeline file instead of a recipe (run by :mod:`credo.pipeline.study`).
_PIPELINE_ARM_KEYS = {"name", "pipeline", "overrides"}
#: The placeholder an arm's override uses for the study's run folder (its setup runs).
SETUP = "{setup}"


@dataclass(frozen=True)
class PipelineArm:
    """An arm that names a pipeline file instead of a recipe: its name, the file and its
    own overrides (run and checked by :mod:`credo.pipeline.study`)."""

    name: str
    file: str
    overrides: tuple[str, ...] = ()


@dataclass
class Study:
    """A study file, checked (see the module docstring for the fields)."""

    name: str
    path: Path
    title: str
    claim: str
    arms: list[Arm]
    seeds: list[int]
    pipelines: list[PipelineArm] = field(default_factory=list)
    paper: str = ""
    env: str | None = None
    overrides: list[str] = field(default_factory=list)
    iterations: int | None = None
    reference: str | None = None
    setup: list[Arm] = field(default_factory=list)
    verdict: str = "pending"
    why: str = ""
    result: str = ""
    notes: str = ""

    def arms_in(self, out_dir: Path) -> list[Arm]:
        """The arms with ``{setup}`` in their overrides replaced by ``out_dir``."""
        return [
            Arm(a.name, a.recipe, tuple(o.replace(SETUP, str(out_dir)) for o in a.overrides))
            for a in self.arms
        ]

    def common_overrides(self) -> list[str]:
        """The overrides of every arm: the study's, with its env and iterations."""
        out = list(self.overrides)
        if self.env is not None:
            out.append(f"env.name={self.env}")
        if self.iterations is not None:
            out.append(f"train.iterations={self.iterations}")
        return out


def _fail(path: Path, what: str) -> ConfigError:
    return ConfigError(f"study {path}: {what}")


def _strings(path: Path, where: str, value: Any) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) and "=" in v for v in value):
        raise _fail(path, f"{where} must be a list of key=value strings, got {value!r}")
    return list(value)


def load_study(path: str | Path, *, machine: bool = True) -> Study:
    """Read and check a study file: every field, every arm's recipe and overrides (each
    arm's config is loaded once with the study's overrides, so a typo stops here, before
    any training).

    With ``machine=False`` (the index, the docs' checks) nothing about this machine is
    checked (``load_config(machine=False)``): an arm that samples with vLLM loads outside
    the vLLM venv, with every setting vLLM refuses still checked.

    Raises:
        ConfigError: one line naming the file, the field and what is accepted.
    """
    from credo.train.config import load_config

    path = Path(path)
    if not path.is_file():
        raise ConfigError(
            f"study {path}: no such file (studies are YAML files, e.g. studies/*.yaml)"
        )
    try:
        data = read_yaml_file(path)
    except yaml.YAMLError as exc:
        raise ConfigError(f"study {path}{yaml_problem(exc)}") from None
    if not isinstance(data, dict):
        raise _fail(path, "must be a mapping of fields (title, claim, arms, ...)")
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        raise _fail(
            path, f"unknown field(s) {', '.join(unknown)}; fields: {', '.join(sorted(_KEYS))}"
        )
    for key in ("title", "claim"):
        if not isinstance(data.get(key), str) or not data[key].strip():
            raise _fail(path, f"needs a {key} (a line of text)")
    seeds = data.get("seeds", 3)
    if isinstance(seeds, int) and not isinstance(seeds, bool) and seeds > 0:
        seeds = list(range(seeds))
    elif not (
        isinstance(seeds, list)
        and seeds
        and all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds)
    ):
        raise _fail(path, f"seeds must be a positive count or a list of seeds, got {seeds!r}")
    iterations = data.get("iterations")
    if iterations is not None and not (isinstance(iterations, int) and iterations > 0):
        raise _fail(path, f"iterations must be a positive integer, got {iterations!r}")
    raw_arms = data.get("arms")
    if not isinstance(raw_arms, list) or not raw_arms:
        raise _fail(path, "needs arms: a list of {name, recipe, overrides}")
    arms: list[Arm] = []
    pipelines: list[PipelineArm] = []
    for k, a in enumerate(raw_arms):
        if isinstance(a, dict) and "pipeline" in a:
            if set(a) - _PIPELINE_ARM_KEYS or not isinstance(a["pipeline"], str):
                raise _fail(
                    path,
                    f"arm {k + 1} must be a mapping with a pipeline file (and name, "
                    f"overrides), got {a!r}",
                )
            if not Path(a["pipeline"]).is_file():
                raise _fail(path, f"arm {k + 1}: no pipeline file {a['pipeline']!r}")
            name = str(a.get("name") or Path(a["pipeline"]).stem)
            own = tuple(_strings(path, f"arm {name}'s overrides", a.get("overrides")))
            pipelines.append(PipelineArm(name, a["pipeline"], own))
            continue
        if not isinstance(a, dict) or set(a) - _ARM_KEYS or not isinstance(a.get("recipe"), str):
            raise _fail(
                path, f"arm {k + 1} must be a mapping with recipe (and name, overrides), got {a!r}"
            )
        name = str(a.get("name") or Path(a["recipe"]).stem)
        arms.append(
            Arm(
                name,
                a["recipe"],
                tuple(_strings(path, f"arm {name}'s overrides", a.get("overrides"))),
            )
        )
    if arms and pipelines:
        raise _fail(path, "arms must all name a recipe or all name a pipeline, not both")
    if pipelines:
        given = [k for k in ("setup", "iterations", "reference") if data.get(k) is not None]
        if given:
            raise _fail(
                path,
                f"a study of pipelines takes no {', '.join(given)} (each pipeline file sets "
                "its stages' budgets; the table has every arm's stages side by side)",
            )
    setup = []
    raw_setup = data.get("setup") or []
    if not isinstance(raw_setup, list):
        raise _fail(path, "setup must be a list of {name, recipe, overrides}")
    for k, a in enumerate(raw_setup):
        if not (
            isinstance(a, dict)
            and not set(a) - _ARM_KEYS
            and isinstance(a.get("recipe"), str)
            and isinstance(a.get("name"), str)
        ):
            raise _fail(
                path, f"setup run {k + 1} must be a mapping with name and recipe, got {a!r}"
            )
        setup.append(
            Arm(
                a["name"],
                a["recipe"],
                tuple(_strings(path, f"setup {a['name']}", a.get("overrides"))),
            )
        )
    names = [a.name for a in [*arms, *pipelines]]
    if len(set(names)) != len(names):
        raise _fail(path, f"arm names must differ: {', '.join(names)}")
    reference = data.get("reference")
    if reference is not None and reference not in names:
        raise _fail(path, f"reference {reference!r} is not an arm; arms: {', '.join(names)}")
    verdict = data.get("verdict", "pending")
    if verdict not in VERDICTS:
        raise _fail(path, f"verdict {verdict!r} is not one of: {', '.join(VERDICTS)}")
    for key in ("paper", "why", "result", "notes"):
        if not isinstance(data.get(key, ""), str):
            raise _fail(path, f"{key} must be text")
    env = data.get("env")
    if env is not None and not isinstance(env, str):
        raise _fail(path, f"env must be an env name, got {env!r}")
    study = Study(
        name=path.stem,
        path=path,
        title=data["title"].strip(),
        claim=data["claim"].strip(),
        arms=arms,
        seeds=seeds,
        pipelines=pipelines,
        paper=data.get("paper", ""),
        env=env,
        overrides=_strings(path, "overrides", data.get("overrides")),
        iterations=iterations,
        reference=reference,
        setup=setup,
        verdict=verdict,
        why=data.get("why", ""),
        result=data.get("result", ""),
        notes=data.get("notes", ""),
    )
    for arm in [*setup, *arms]:  # every config loads (names, values, files) before any run
        # an override naming a setup run is checked once that run exists (run_study);
        # here without it, or, where the rest needs it, with empty stand-in folders
        own = [o for o in arm.overrides if SETUP not in o]
        overrides = [*study.common_overrides(), *own]
        try:
            load_config(arm.recipe, overrides, machine=machine)
        except ConfigError as exc:
            problem = str(exc)
            if len(own) < len(arm.overrides):  # retried with the setup paths stood in
                problem = _stand_in_problem(arm, overrides, machine)
            if problem:
                raise _fail(path, f"arm {arm.name}: {problem}") from None
    # pipeline arms are checked stage by stage by credo.pipeline.study before they run
    return study


def run_study(
    study: Study,
    *,
    out_root: Path = Path("runs/studies"),
    docs: Path | None = Path("docs/studies"),
    jobs: int = 1,
    on_run: Any = None,
    command: str | None = None,
    records: Path | None = None,
) -> list[RecipeSummary]:
    """Train the study's arms × seeds (resumable) into ``out_root/<name>``; with
    ``docs``, write its page and refresh the index there. With ``records``, the runs are
    recorded in (and, where recorded with the same config, read from)
    ``records/<name>`` (:mod:`credo.commands.records`). Returns the summaries."""
    from credo.train.config import load_config

    out_dir = Path(out_root) / study.name
    if study.pipelines:
        raise ConfigError(
            f"study {study.path}: its arms are pipelines: run it with "
            "credo.pipeline.study.run_pipeline_study (credo study does)"
        )
    for run in study.setup:  # trained once (resumed, or read when finished)
        cfg = load_config(
            run.recipe,
            [
                *study.common_overrides(),
                *run.overrides,
                f"train.runs_dir={out_dir}",
                f"train.name={run.name}",
            ],
        )
        _run_one(cfg, out_dir / run.name)
    summaries = compare(
        study.arms_in(out_dir),
        study.seeds,
        overrides=study.common_overrides(),
        out_dir=out_dir,
        reference=study.reference,
        on_run=on_run,
        jobs=jobs,
        records=None if records is None else Path(records) / study.name,
    )
    publish(study, out_dir, docs, command, records)
    return summaries


def publish(
    study: Study,
    out_dir: Path,
    docs: Path | None,
    command: str | None,
    records: Path | None = None,
) -> None:
    """With ``docs``: the study's page from ``out_dir`` and the index beside it."""
    if docs is not None:
        cmd = command or f"credo study {study.path}"
        write_page(study, out_dir, Path(docs), cmd, records)
        write_index(study.path.parent, Path(docs))


def write_page(
    study: Study, out_dir: Path, docs: Path, command: str, records: Path | None = None
) -> Path:
    """``docs/<name>.md`` from the study file and the comparison in ``out_dir`` (its
    table ``compare.md``, its seeds in ``compare.json`` and its plot ``compare.png``);
    with ``records``, a line naming the folder of the study's run records, the credo
    commits they were trained at and the CPUs they were trained on."""
    data = json.loads((out_dir / "compare.json").read_text())
    img = docs / "img" / f"{study.name}.png"
    img.parent.mkdir(parents=True, exist_ok=True)
    if (out_dir / "compare.png").exists():
        shutil.copyfile(out_dir / "compare.png", img)
    arm_rows = [[a.name, a.recipe, " ".join(a.overrides) or "—"] for a in study.arms]
    arm_rows += [[a.name, f"`{a.file}`", " ".join(a.overrides) or "—"] for a in study.pipelines]
    common = " ".join(shlex.quote(o) for o in study.common_overrides())
    lines = [
        f"# {study.title}",
        "",
        f"**Claim.** {study.claim}",
        "",
        *([f"**Paper.** {study.paper}", ""] if study.paper else []),
        f"**Verdict: {study.verdict}.** {study.why}".rstrip(),
        "",
        "```bash",
        command,
        "```",
        "",
        f"Study file: [`{study.path.name}`](../../studies/{study.path.name}). "
        f"Seeds {', '.join(map(str, data['seeds']))}; every arm: "
        f"`{common or 'the recipe defaults'}`.",
        "",
        markdown_table(
            ["arm", "pipeline" if study.pipelines else "recipe", "its overrides"], arm_rows
        ),
        "",
        (out_dir / "compare.md").read_text().strip(),
        "",
        *(
            [
                f"![training success vs env steps, every arm, band = min-max over seeds](img/{study.name}.png)",
                "",
            ]
            if (out_dir / "compare.png").exists()
            else []
        ),
    ]
    held = None if records is None else Path(records) / study.name
    if held is not None and held.is_dir() and (commits := record_commits(held)):
        try:  # linked as the study file is, when beside it
            rel = held.resolve().relative_to(study.path.parent.resolve()).as_posix()
            where = f"[`studies/{rel}/`](../../studies/{rel}/)"
        except ValueError:
            where = f"`{held}/`"
        lines += [
            f"Run records (each run's config, evaluations and metrics): {where}, "
            f"trained at credo {', '.join(f'`{c[:12]}`' for c in commits)} "
            f"on {'; '.join(record_cpus(held))}.",
            "",
        ]
    if study.notes.strip():
        lines += [study.notes.strip(), ""]
    page = docs / f"{study.name}.md"
    docs.mkdir(parents=True, exist_ok=True)
    write_text_atomic(page, "\n".join(lines))
    return page


def _stand_in_problem(arm: Arm, common: list[str], machine: bool) -> str:
    """Why ``arm`` does not load with its ``{setup}`` overrides pointing at empty folders
    that stand in for the setup runs' (which do not exist before the study runs), or
    ``""``."""
    from credo.train.config import load_config

    with tempfile.TemporaryDirectory() as folder:
        stand_ins = []
        for o in arm.overrides:
            if SETUP in o:
                o = o.replace(SETUP, folder)
                value = o.partition("=")[2].strip()
                if value.startswith(folder):
                    Path(value).mkdir(parents=True, exist_ok=True)
                stand_ins.append(o)
        try:
            load_config(arm.recipe, [*common, *stand_ins], machine=machine)
        except ConfigError as exc:
            return str(exc)
    return ""


def write_index(studies: Path, docs: Path) -> Path:
    """``docs/README.md``: one row per study file in ``studies`` (title, paper, claim,
    credo's result, verdict and why), linking each page."""
    rows = []
    for path in sorted(Path(studies).glob("*.yaml")):
        s = load_study(path, machine=False)
        page = f"[{s.title}]({s.name}.md)" if (docs / f"{s.name}.md").exists() else s.title
        rows.append([page, s.paper or "—", s.claim, s.result or "—", s.verdict, s.why or "—"])
    text = "\n".join(
        [
            "# Studies",
            "",
            "Each row is a study file in `studies/`, re-run with `credo study studies/NAME.yaml"
            " --jobs 2` (resumable; about an hour on 2 cores unless its page says otherwise). "
            "Its page holds the command, the table with every seed and the plot; each "
            "finished run is recorded in `studies/records/NAME/` (its config, evaluations "
            "and metrics, and its seed's warm start when small), and a run recorded with "
            "the same config is read, not trained.",
            "",
            markdown_table(["study", "paper", "claim", "credo's result", "verdict", "why"], rows),
            "",
        ]
    )
    index = docs / "README.md"
    docs.mkdir(parents=True, exist_ok=True)
    write_text_atomic(index, text)
    return index
