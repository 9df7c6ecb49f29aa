"""The README's training-script example runs as written (one process, gloo on the CPU)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.launch import without_launcher

REPO = Path(__file__).resolve().parents[1]


def readme_example() -> str:
    text = (REPO / "README.md").read_text()
    section = text.split("## Your own training script", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```python\n(.*?)^```$", section, flags=re.MULTILINE | re.DOTALL)
    assert len(blocks) == 1, f"expected one python block in the section, found {len(blocks)}"
    return str(blocks[0])


@pytest.mark.slow
def test_readme_training_example_runs_as_one_process(tmp_path: Path) -> None:
    script = tmp_path / "my_train.py"
    script.write_text(readme_example())
    # No launcher's variables: the example must not join some other group.
    env = without_launcher(os.environ)
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Distributed training initialized: gloo backend, 1 process" in done.stdout
    last_epoch = re.compile(r"^epoch 1: loss \d+\.\d{4} \(world size 1\)$", re.MULTILINE)
    assert last_epoch.search(done.stdout), done.stdout
    assert (tmp_path / "model.pt").is_file()
