"""A submission that sbatch refuses leaves nothing behind: no state folder, no secrets
folder, no submitit folder, in the project folder or in the user's own state folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpcdist.errors import UserError
from hpcdist.jobs.records import load_record
from hpcdist.jobs.submit import job_workdir, submit
from hpcdist.render.script import render
from hpcdist.spec.options import spec_from_options
from hpcdist.state.snapshot import FolderSnapshot

REFUSAL = "sbatch: error: invalid partition specified: nope"


def _fake_slurm(bindir: Path, sbatch_exit: int = 1) -> Path:
    """A stand-in sbatch that refuses (or accepts) with sbatch's words, and an srun that
    submitit looks for."""
    bindir.mkdir(parents=True)
    sbatch = bindir / "sbatch"
    sbatch.write_text(
        "#!/bin/bash\n"
        f"if [ {sbatch_exit} -ne 0 ]; then echo '{REFUSAL}' >&2; exit {sbatch_exit}; fi\n"
        "echo 'Submitted batch job 4242'\n"
    )
    sbatch.chmod(0o755)
    srun = bindir / "srun"
    srun.write_text("#!/bin/bash\nexit 0\n")
    srun.chmod(0o755)
    return bindir


def _tree(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.parametrize("sweep", [(), ("training.lr=1e-3,2e-3",)])
def test_a_refused_slurm_submit_removes_every_folder_it_made(
    sweep: tuple[str, ...], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bindir = _fake_slurm(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    project = tmp_path / "project"
    project.mkdir()
    spec = spec_from_options({"profile": None, "mode": "gloo", "sweep": sweep})
    with pytest.raises(UserError, match=r"could not submit the job: .*invalid partition"):
        submit(spec, "slurm", project_dir=project, preflight_check=False)
    assert _tree(project) == []  # no .hpcdist, secrets or submitit folder


def test_a_refused_submit_keeps_what_was_there_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bindir = _fake_slurm(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    project = tmp_path / "project"
    kept = project / ".hpcdist" / "jobs" / "41.json"
    kept.parent.mkdir(parents=True, mode=0o700)
    (project / ".hpcdist").chmod(0o700)
    kept.write_text("{}")
    spec = spec_from_options({"profile": None, "mode": "gloo"})
    with pytest.raises(UserError):
        submit(spec, "slurm", project_dir=project, preflight_check=False)
    assert _tree(project) == [".hpcdist", ".hpcdist/jobs", ".hpcdist/jobs/41.json"]


def test_an_accepted_submit_keeps_its_folders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bindir = _fake_slurm(tmp_path / "bin", sbatch_exit=0)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    project = tmp_path / "project"
    project.mkdir()
    spec = spec_from_options({"profile": None, "mode": "gloo"})
    record = submit(spec, "slurm", project_dir=project, preflight_check=False).record
    assert record.job_id == "4242"
    made = _tree(project)
    assert ".hpcdist/jobs/4242.json" in made
    # submitit keeps the very script it queued (the job makes its own secret when it starts).
    queued = project / ".hpcdist/submitit/4242/4242_submission.sh"
    assert queued.read_text() == render(spec)
    assert ".hpcdist/secrets" not in made


@pytest.mark.parametrize(
    ("chdir", "ran_in"), [(None, "project"), ("run", "project/run"), ("../out", "out")]
)
def test_an_accepted_submit_records_the_folder_the_job_runs_in(
    chdir: str | None, ran_in: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`hpcdist report` looks for the job's runs/ there (--chdir, read from the submit
    folder as sbatch reads it)."""
    bindir = _fake_slurm(tmp_path / "bin", sbatch_exit=0)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    project = tmp_path / "project"
    (project / "run").mkdir(parents=True)
    (tmp_path / "out").mkdir()
    monkeypatch.chdir(project)
    spec = spec_from_options({"profile": None, "mode": "gloo", "workdir": chdir})
    record = submit(spec, "slurm", project_dir=project, preflight_check=False).record
    assert record.workdir == str(tmp_path / ran_in)
    assert load_record(record.job_id, project).workdir == record.workdir
    assert job_workdir(spec) == record.workdir  # local ranks start there too


def test_a_cli_submit_from_a_shared_folder_is_refused_before_anything_is_made(
    tmp_path: Path,
) -> None:
    """A working folder others can write is refused in one line (its job's runner would
    refuse it when it starts): no state folder, here or in the user's own."""
    bindir = _fake_slurm(tmp_path / "bin")
    work = tmp_path / "home" / "shared-work"
    work.mkdir(parents=True)
    work.chmod(0o777)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "HPCDIST_"))}
    env.update(
        PATH=f"{bindir}:{os.path.dirname(sys.executable)}:/usr/bin:/bin",
        HOME=str(tmp_path / "home"),
        XDG_STATE_HOME=str(tmp_path / "home" / "state"),
    )
    submit_args = ["submit", "--executor", "slurm", "--no-preflight", "--mode", "gloo"]
    proc = subprocess.run(
        [sys.executable, "-m", "hpcdist.cli.main", *submit_args],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"hpcdist: error: the job's working folder '{work}' can be written")
    assert "Traceback" not in proc.stderr
    assert _tree(work) == []
    # At most the empty folder its log would have gone to (a log in a shared folder goes to
    # the user's own, made when the job is described): no file anywhere.
    state = tmp_path / "home" / "state"
    assert [p for p in state.rglob("*") if not p.is_dir()] == []


def test_the_snapshot_removes_only_what_was_made_after_it(tmp_path: Path) -> None:
    old = tmp_path / "root" / "old"
    old.mkdir(parents=True)
    snapshot = FolderSnapshot.take(tmp_path / "root" / "deeper" / "state")
    (tmp_path / "root" / "deeper" / "state" / "new").mkdir(parents=True)
    (tmp_path / "root" / "deeper" / "state" / "new" / "file").write_text("x")
    (old / "later").write_text("someone's")  # beside the snapshot's folder: never its to remove
    snapshot.remove_made()
    assert _tree(tmp_path) == ["root", "root/old", "root/old/later"]


def test_a_local_job_starts_in_its_chdir_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # --chdir moves a SLURM job's tasks (sbatch); a local job's ranks start there too.
    import sys

    from hpcdist.jobs.records import load_record, wait_for_final_state
    from hpcdist.jobs.submit import submit
    from hpcdist.spec.options import spec_from_options

    monkeypatch.chdir(tmp_path)
    (tmp_path / "work dir").mkdir()
    probe = f"{sys.executable} -c 'import os; print(\"cwd\", os.getcwd())'"
    spec = spec_from_options(
        {"profile": None, "mode": "threads", "workdir": "work dir", "command": probe}
    )
    record = submit(spec, "local", project_dir=tmp_path).record
    assert wait_for_final_state(record, timeout_s=120, poll_s=0.2) == "COMPLETED"
    log = load_record(record.job_id, tmp_path).log_path(0).read_text()
    assert f"cwd {tmp_path / 'work dir'}" in log
