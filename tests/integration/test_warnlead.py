"""A warning lead shorter than the checkpoint: the job checkpoints early on its own.

Every checkpoint write of this training is made slow (``training.test_checkpoint_delay_s``),
longer than the lead of ``--signal=USR2@10`` and longer than the up to 30 s SLURM may send
the warning early: on the warning alone the checkpoint would still be on its way when the
time limit kills the job. The job measures its checkpoints, stops early by SLURM's
EndTime, is requeued and resumes; it ends with bitwise the weights of an uninterrupted run.
The first piece trains until its stop (a million epochs): no machine finishes before it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from tests.integration.conftest import SlurmCluster, sbatch
from tests.integration.test_faults import _follow, _log, _training_job, _wait_for, _weights

# test_faults' training, with every checkpoint write made slow.
CONFIG = """\
data: {{mask: ocean}}
training: {{epochs: {epochs}, lr: 1.0e-3, early_stopping_patience: 0, checkpoint_every: 10,
  test_checkpoint_delay_s: {delay}}}
preemption: {{check_every_steps: 5}}
"""
DELAY_S = 30
STOPPED = re.compile(r"Stop requested: checkpoint at epoch (\d+), step (\d+) of the epoch")


# The full tier's (docs/testing.md): 2 ranks train through a 3-minute time limit, then a
# reference as long; the rule is tests/distributed/test_warnlead.py's, the training's early
# stop tests/ufsemulator/training/test_training.py's.
@pytest.mark.full
def test_a_checkpoint_longer_than_the_warning_lead_is_written_early_and_resumes_bitwise(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    script = _training_job(tmp_path, "slow", 1, time="3", signal="USR2@10", max_restarts=3)
    config = tmp_path / "slow.yaml"
    config.write_text(CONFIG.format(epochs=1_000_000, delay=DELAY_S))
    job = sbatch(script, cwd=tmp_path, wait=False)

    def log() -> str:
        return _log(tmp_path, "slow", job.job_id)

    _wait_for(lambda: STOPPED.search(log()), 300, "the early checkpoint", job.job_id, log)
    first = log()
    assert "warning lead 10 s is shorter than the last checkpoint (3" in first, first
    early = first.index("hpcdist: checkpointing early")
    stopped = STOPPED.search(first)
    assert stopped is not None and early < stopped.start(), first
    # The run ends one epoch after the one it stopped in; the rest is as fast as it goes.
    epochs = int(stopped.group(1)) + 1
    config.write_text(CONFIG.format(epochs=epochs, delay=0))
    reference = tmp_path / "reference.yaml"
    ref_script = _training_job(tmp_path, "reference", epochs)
    reference.write_text(CONFIG.format(epochs=epochs, delay=0))
    ref = sbatch(ref_script, cwd=tmp_path, wait=False)

    state = _follow(job.job_id, timeout=600)
    assert state == "COMPLETED", log()
    assert re.search(r"Resuming from \S+ \(epoch \d+, restart 1\)", log()), log()
    assert "hpcdist: checkpoint written, requeueing" in log(), log()
    assert _follow(ref.job_id, timeout=600, release=False) == "COMPLETED"
    final = _weights(tmp_path / "runs" / str(job.job_id))
    expected = _weights(tmp_path / "runs" / str(ref.job_id))
    assert final.keys() == expected.keys()
    for key in expected:
        assert torch.equal(final[key], expected[key]), f"{key} differs after the early stop"
    line = first[early:].splitlines()[0]
    print(f"measured: {line}; stopped in epoch {epochs - 1}, resumed, weights bitwise equal")
