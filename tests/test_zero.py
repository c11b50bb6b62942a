"""DeepSpeed ZeRO-1/2 (:mod:`credo.engines.zero`) with 2 gloo processes on 127.0.0.1.

- One update on the same global batch with credo's AdamW inside a ZeRO-2 engine (as an
  accelerate DeepSpeed config asks: ``ACCELERATE_USE_DEEPSPEED=true``) gives the weights,
  the metrics and the AdamW moments of 1 process; rank 1 runs zero-weight passes; the
  gathered optimizer state loads back fragment by fragment into a fresh engine.
- ``accelerate launch --config_file examples/accelerate/deepspeed.yaml`` (ZeRO-1 by
  ``--zero_stage 1``) writes one run folder with full safetensors checkpoints, and
  ``--resume`` with 2 processes ends with the weights and metrics of the uninterrupted run.

Every process has a bounded wait (``CREDO_DIST_TIMEOUT``, the join deadline, the
subprocess timeout) and is killed in a ``finally``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from credo.engines import zero

pytest.importorskip(
    "deepspeed",
    reason="deepspeed not installed: pip install 'credo[deepspeed]' (make install does)",
)

from test_distributed import TINY
from test_fsdp import (
    _accelerate,
    assert_resume_is_exact,
    assert_sharded_run,
    ranks_equal_one_process,
)

pytestmark = pytest.mark.slow  # the slow tier: several processes, DeepSpeed ZeRO

ACCELERATE = Path(sys.executable).with_name("accelerate")
DS_YAML = Path(__file__).resolve().parents[1] / "examples" / "accelerate" / "deepspeed.yaml"


#: The variables ``accelerate launch`` sets for a ZeRO-2 DeepSpeed config.
ZERO2_ENV = {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "2"}


def test_zero2_update_equals_one_process(tmp_path: Path) -> None:
    ranks_equal_one_process(ZERO2_ENV, tmp_path)


@pytest.mark.skipif(
    not ACCELERATE.exists(), reason="accelerate not installed (make smollm installs it)"
)
def test_accelerate_zero1_train_and_resume(tmp_path: Path) -> None:
    iterations = 2
    launch = ["--config_file", str(DS_YAML), "--zero_stage", "1"]
    _accelerate(
        [
            "--recipe",
            "grpo",
            *TINY,
            "objective.entropy_coef=0.01",
            "optim.micro_batch_rows=24",  # 3 micro-batches: padded passes on rank 1
            f"train.iterations={iterations}",
            "train.checkpoint_every=1",
            f"train.keep_checkpoints={iterations}",
            f"train.runs_dir={tmp_path}",
            "train.name=full",
        ],
        tmp_path,
        launch=launch,
    )
    full = tmp_path / "full"
    records = assert_sharded_run(full, "zero1", iterations)
    assert_resume_is_exact(full, tmp_path, iterations, records, launch=launch)


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"ACCELERATE_DEEPSPEED_ZERO_STAGE": "3"}, "use the FSDP config"),
        ({"ACCELERATE_DEEPSPEED_ZERO_STAGE": "0"}, "shards nothing"),
        ({"ACCELERATE_DEEPSPEED_ZERO_STAGE": "x"}, "expected 1 or 2"),
        ({"ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE": "cpu"}, "offload is not supported"),
        ({"ACCELERATE_DEEPSPEED_CONFIG_FILE": "ds.json"}, "give zero_stage in the accelerate"),
    ],
)
def test_unsupported_deepspeed_settings_are_one_line(env: dict[str, str], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        zero.stage({"ACCELERATE_USE_DEEPSPEED": "true", **env})


def test_deepspeed_settings_from_accelerate() -> None:
    assert zero.stage({}) == 2 and zero.stage({"ACCELERATE_DEEPSPEED_ZERO_STAGE": "1"}) == 1
    assert zero.stage({"ACCELERATE_DEEPSPEED_CONFIG_FILE": "none"}) == 2  # the launcher's "none"
    assert zero.requested({"ACCELERATE_USE_DEEPSPEED": "true"}) and not zero.requested({})
