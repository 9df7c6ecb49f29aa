"""Per-rank logs (--rank-logs label|split|none) in the rendered srun line, and
`hpcdist logs JOB --rank N` finding a rank in each mode."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from hpcdist.cli.main import cli
from hpcdist.facts.launch import rank_log_pattern
from hpcdist.render.script import render
from hpcdist.spec.options import spec_from_options


@pytest.mark.parametrize(
    ("rank_logs", "words"),
    [
        ("label", ["--label"]),
        ("split", ["--output=%x-%j.rank%t.out"]),
        ("none", []),
    ],
)
def test_rank_logs_in_the_rendered_srun_line(rank_logs: str, words: list[str]) -> None:
    spec = spec_from_options({"profile": None, "mode": "gloo", "rank_logs": rank_logs})
    srun = next(ln.strip() for ln in render(spec).splitlines() if ln.lstrip().startswith("srun "))
    tail = srun.split("--kill-on-bad-exit=1", 1)[1].rstrip(" \\").split()
    assert tail == words


@pytest.mark.parametrize(
    ("log", "rank", "expected"),
    [
        ("%x-%j.out", "%t", "%x-%j.rank%t.out"),
        ("logs/run.%j.log", "%t", "logs/run.%j.rank%t.log"),
        ("plain", "%t", "plain.rank%t"),
        ("/d.x/emu-12.out", "3", "/d.x/emu-12.rank3.out"),
        ("/d.x/.hidden", "0", "/d.x/.hidden.rank0"),
    ],
)
def test_rank_log_pattern(log: str, rank: str, expected: str) -> None:
    assert rank_log_pattern(log, rank) == expected


def test_split_rank_logs_keep_stderr_apart_when_the_job_does() -> None:
    spec = spec_from_options(
        {"profile": None, "mode": "gloo", "rank_logs": "split", "error": "e-%j.err"}
    )
    srun = next(ln.strip() for ln in render(spec).splitlines() if ln.lstrip().startswith("srun "))
    assert "--output=%x-%j.rank%t.out --error=e-%j.rank%t.err" in srun


def _finished_job(stdout: Path) -> Any:
    from hpcdist.slurm.query import JobInfo

    return JobInfo(
        job_id="42",
        name="emu",
        state="COMPLETED",
        reason=None,
        nodes="node[1-2]",
        num_nodes=2,
        elapsed_s=3.0,
        limit_s=60.0,
        exit_code=0,
        signal=0,
        restarts=0,
        stdout=str(stdout),
        stderr=str(stdout),
        workdir=str(stdout.parent),
        source="scontrol",
    )


@pytest.mark.parametrize(
    ("files", "rank", "expected"),
    [
        # --rank-logs label: srun's labels pick the rank, and are taken off.
        (
            {"emu-42.out": "hpcdist: job 42\n0: [Rank 0] up\n1: [Rank 1] up\n1: Traceback\n"},
            1,
            "[Rank 1] up\nTraceback\n",
        ),
        # Twelve tasks: srun pads the label (' 3: ').
        ({"emu-42.out": " 3: [Rank 3] up\n13: [Rank 13] up\n"}, 3, "[Rank 3] up\n"),
        # --rank-logs split: the rank's own file beside the job's log.
        (
            {"emu-42.out": "hpcdist: job 42\n", "emu-42.rank1.out": "[Rank 1] up\nplain line\n"},
            1,
            "[Rank 1] up\nplain line\n",
        ),
        # --rank-logs none: the ranks' own prefix.
        ({"emu-42.out": "[Rank 0] a\n[Rank 1] b\n"}, 1, "[Rank 1] b\n"),
    ],
    ids=["label", "label-padded", "split", "none"],
)
def test_logs_rank_finds_a_rank_in_every_rank_logs_mode(
    files: dict[str, str],
    rank: int,
    expected: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from hpcdist.cli import follow as cli_follow

    for name, text in files.items():
        (tmp_path / name).write_text(text)
    job = _finished_job(tmp_path / "emu-42.out")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cli_follow, "query_job", lambda job_id: job if job_id == "42" else None)
    monkeypatch.setattr(cli_follow, "query_jobs", lambda job_id: [job] if job_id == "42" else [])
    result = CliRunner().invoke(cli, ["logs", "42", "--rank", str(rank)])
    assert result.exit_code == 0, result.output
    assert result.stdout == expected
