"""Trusted files are opened once, checked by what was opened and used from those bytes.

Each race is made deterministic with ``HPCDIST_TEST_PAUSE``: the reader stops right
after its check (where a check-then-reopen design would open the file again), the test
swaps the names, and the reader must go on with what it checked. Both sides of every
boundary are asserted: owner ok / another owner, mode ok / group- or other-writable.
"""

from __future__ import annotations

import ast
import os
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from hpcdist.state.digests import DigestBook
from hpcdist.state.private import PrivacyError, user_name
from hpcdist.state.trustedfile import PAUSE_VAR, Refused, read_trusted, trusted_root

REPO = Path(__file__).resolve().parents[2]
NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")


def swap(a: Path, b: Path) -> None:
    """Exchange two names, as another user with write access to their folder would."""
    tmp = a.with_name(a.name + ".swap")
    os.rename(a, tmp)
    os.rename(b, a)
    os.rename(tmp, b)


def paused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, label: str, action: Callable[[], object]
) -> tuple[Callable[[], None], list[object]]:
    """Run ``action`` in a thread that stops at ``label``; returns (resume, results)."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    monkeypatch.setenv(PAUSE_VAR, f"{label}:{hooks}")
    results: list[object] = []

    def run() -> None:
        try:
            results.append(action())
        except BaseException as exc:  # reported to the test
            results.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    for _ in range(400):
        if (hooks / f"{label}.ready").exists():
            break
        thread.join(0.05)
    assert (hooks / f"{label}.ready").exists(), results

    def resume() -> None:
        (hooks / f"{label}.go").touch()
        thread.join(30)

    return resume, results


# ------------------------------------------------------------------ the helper itself


@pytest.mark.parametrize(
    ("mode", "refused"), [(0o600, False), (0o644, False), (0o664, True), (0o606, True)]
)
def test_file_mode_boundary(tmp_path: Path, mode: int, refused: bool) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"mine")
    path.chmod(mode)
    if refused:
        with pytest.raises(Refused, match=rf"'{path}' is writable by .* mode {mode:04o}"):
            read_trusted(path, "record")
    else:
        assert read_trusted(path, "record").data == b"mine"


@pytest.mark.parametrize(("mode", "refused"), [(0o755, False), (0o775, True), (0o757, True)])
def test_folder_mode_boundary(tmp_path: Path, mode: int, refused: bool) -> None:
    folder = tmp_path / "state"
    folder.mkdir()
    (folder / "f").write_bytes(b"mine")
    folder.chmod(mode)
    if refused:
        with pytest.raises(Refused, match=rf"record '{folder}' is writable by .*, owner "):
            read_trusted(folder / "f", "record", root=tmp_path)
    else:
        assert read_trusted(folder / "f", "record", root=tmp_path).data == b"mine"


@needs_root
def test_owner_boundary_names_the_owner(tmp_path: Path) -> None:
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    for path in (mine, theirs):
        path.write_bytes(b"x")
    os.chown(theirs, NOBODY, NOBODY)
    assert read_trusted(mine, "secret").data == b"x"
    with pytest.raises(Refused, match=rf"secret '{theirs}' is owned by uid {NOBODY} \(nobody\)"):
        read_trusted(theirs, "secret")
    folder = tmp_path / "sub"
    folder.mkdir()
    (folder / "f").write_bytes(b"x")
    os.chown(folder, NOBODY, NOBODY)
    with pytest.raises(Refused, match=rf"'{folder}' is owned by uid {NOBODY}"):
        read_trusted(folder / "f", "secret", root=tmp_path)


def test_links_and_fifos_are_refused(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "f").write_bytes(b"x")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    (tmp_path / "flink").symlink_to(tmp_path / "real" / "f")
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(Refused, match="link' is a symbolic link"):
        read_trusted(tmp_path / "link" / "f", "record", root=tmp_path)
    with pytest.raises(Refused, match="flink' is a symbolic link"):
        read_trusted(tmp_path / "flink", "record")
    with pytest.raises(Refused, match="fifo' is not a regular file"):
        read_trusted(tmp_path / "fifo", "record")  # and it did not hang


def test_trusted_root_is_home_for_files_below_it(tmp_path: Path) -> None:
    home = Path.home()
    assert trusted_root(home / ".config" / "x") == home
    assert trusted_root(tmp_path / "a") == tmp_path / "a"


def test_a_name_swapped_after_the_check_does_not_change_what_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, other = tmp_path / "record", tmp_path / "other"
    path.write_bytes(b"checked")
    other.write_bytes(b"planted")
    resume, results = paused(
        monkeypatch, tmp_path, "t", lambda: read_trusted(path, "record", pause_label="t")
    )
    swap(path, other)
    resume()
    assert path.read_bytes() == b"planted"  # the name now holds the other file
    assert [r.data for r in results] == [b"checked"]  # type: ignore[attr-defined]


# ------------------------------------------------------------------ race 1: checkpoint


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    folder = tmp_path / "project"
    folder.mkdir()
    monkeypatch.chdir(folder)
    monkeypatch.delenv("HPCDIST_HOME", raising=False)
    yield folder


def _state(value: float) -> dict[str, object]:
    return {"model": {"w": torch.full((2,), value)}, "model_config": {}, "epoch": 5, "config": {}}


def test_checkpoint_swapped_after_its_check_is_not_what_is_loaded(
    project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hpcdist.distributed import single_process
    from hpcdist.state.digests import default_book
    from ufsemulator.checkpoints.checkpoint import load_checkpoint_bytes, save_checkpoint
    from ufsemulator.training.runfiles import make_run_dir, trusted_resume

    run_dir = project / "runs" / "7"
    make_run_dir(run_dir)
    save_checkpoint(_state(1.0), run_dir / "checkpoint.pt", default_book(), anchor=project)
    evil = project / "evil" / "7"
    evil.mkdir(parents=True)
    torch.save(_state(-9.0), evil / "checkpoint.pt")
    ctx = single_process({})
    resume, results = paused(
        monkeypatch, tmp_path, "resume-read", lambda: trusted_resume(ctx, Path("runs/7"))
    )
    swap(project / "runs", project / "evil")  # renameat2(RENAME_EXCHANGE) in the attack
    resume()
    found = results[0]
    assert isinstance(found, tuple), results
    state = load_checkpoint_bytes(found[1], found[0])
    assert torch.equal(state["model"]["w"], torch.full((2,), 1.0))  # the checked bytes


@needs_root
def test_checkpoint_in_a_folder_of_another_user_is_not_resumed(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from hpcdist.distributed import single_process
    from hpcdist.state.digests import default_book
    from ufsemulator.checkpoints.checkpoint import save_checkpoint
    from ufsemulator.training.runfiles import make_run_dir, trusted_resume

    run_dir = project / "runs" / "7"
    make_run_dir(run_dir)
    save_checkpoint(_state(1.0), run_dir / "checkpoint.pt", default_book(), anchor=project)
    assert trusted_resume(single_process({}), Path("runs/7")) is not None  # owner ok
    os.chown(project / "runs", NOBODY, NOBODY)  # the folder swapped in before the check
    assert trusted_resume(single_process({}), Path("runs/7")) is None
    said = capsys.readouterr().out.strip().splitlines()
    assert said[-1].startswith(f"Not resuming runs/7/checkpoint.pt: '{project / 'runs'}' is ")
    assert f"owned by uid {NOBODY} (nobody)" in said[-1] and "starting fresh" in said[-1]


def test_writer_writes_through_the_folder_it_checked(
    project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hpcdist.state.digests import default_book, sha256_file
    from ufsemulator.checkpoints.checkpoint import save_checkpoint
    from ufsemulator.training.runfiles import make_run_dir

    run_dir = project / "runs" / "7"
    make_run_dir(run_dir)
    (project / "evil" / "7").mkdir(parents=True)
    book = default_book()
    resume, results = paused(
        monkeypatch,
        tmp_path,
        "checkpoint-write",
        lambda: save_checkpoint(_state(1.0), run_dir / "checkpoint.pt", book, anchor=project),
    )
    swap(project / "runs", project / "evil")
    resume()
    assert not isinstance(results[0], BaseException), results
    # Written into the folder that was checked (now named evil/), not into the other one.
    assert (project / "evil" / "7" / "checkpoint.pt").is_file()
    assert not (project / "runs" / "7" / "checkpoint.pt").exists()
    written = project / "evil" / "7" / "checkpoint.pt"
    assert sha256_file(written) in book.accepted(run_dir / "checkpoint.pt")


@needs_root
def test_writer_refuses_a_run_folder_of_another_user_naming_it(project: Path) -> None:
    from ufsemulator.checkpoints.checkpoint import save_checkpoint
    from ufsemulator.training.runfiles import make_run_dir

    run_dir = project / "runs" / "7"
    make_run_dir(run_dir)
    save_checkpoint(_state(1.0), run_dir / "checkpoint.pt", anchor=project)  # owner ok
    os.chown(project / "runs", NOBODY, NOBODY)
    with pytest.raises(PrivacyError, match=rf"'{project / 'runs'}' is owned by uid {NOBODY}"):
        save_checkpoint(_state(2.0), run_dir / "checkpoint.pt", anchor=project)


def test_run_folders_are_never_group_writable_whatever_the_umask(project: Path) -> None:
    from hpcdist.distributed import single_process
    from ufsemulator.config import Config
    from ufsemulator.training.runfiles import resolve_run_dir

    previous = os.umask(0o002)
    try:
        resolve_run_dir(single_process({}), Config(), None, None)
    finally:
        os.umask(previous)
    runs = project / "runs"
    assert runs.stat().st_mode & 0o777 == 0o755
    assert all(p.stat().st_mode & 0o777 == 0o755 for p in runs.iterdir())


def test_a_group_writable_runs_folder_fails_the_run_in_one_line(project: Path) -> None:
    from hpcdist.distributed import single_process
    from ufsemulator.config import Config
    from ufsemulator.training.runfiles import resolve_run_dir

    (project / "runs").mkdir(mode=0o755)
    resolve_run_dir(single_process({}), Config(), "runs/a", None)  # mode ok
    (project / "runs").chmod(0o775)
    with pytest.raises(PrivacyError) as caught:
        resolve_run_dir(single_process({}), Config(), "runs/b", None)
    line = str(caught.value)
    assert f"run folder '{project / 'runs'}' is writable by group" in line
    assert "mode 0775" in line and "refusing to write or resume there" in line


def test_a_runs_folder_that_refuses_the_mkdir_is_still_named_with_its_problem(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hpcdist.distributed import single_process
    from ufsemulator.config import Config
    from ufsemulator.training.runfiles import resolve_run_dir

    (project / "runs").mkdir()
    (project / "runs").chmod(0o775)

    def refused(path: object, mode: int = 0o777) -> None:  # as another user's runs/ would
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(os, "mkdir", refused)
    with pytest.raises(PrivacyError) as caught:
        resolve_run_dir(single_process({}), Config(), "runs/b", None)
    line = str(caught.value)
    assert f"run folder '{project / 'runs'}' is writable by group" in line, line
    (project / "runs").chmod(0o755)
    with pytest.raises(PrivacyError, match=r"runs/b' cannot be made or opened \(Permission"):
        resolve_run_dir(single_process({}), Config(), "runs/b", None)


def test_digest_book_compares_the_bytes_read(tmp_path: Path) -> None:
    book = DigestBook(tmp_path / ".hpcdist" / "digests", tmp_path / ".hpcdist")
    target = tmp_path / "checkpoint.pt"
    book.settle(target, "a" * 64)
    assert book.problem(target, "a" * 64) == ""
    assert "differs from the recorded" in book.problem(target, "b" * 64)


# ------------------------------------------------------------------ race 2: profile


def test_profile_swapped_after_its_check_is_not_what_is_parsed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hpcdist.spec.profiles import load_profile

    folder = tmp_path / "profiles"
    folder.mkdir()
    (folder / "site.yaml").write_text("setup: ['echo mine']\n")
    (folder / "evil.yaml").write_text("setup: ['echo MALLORY-SETUP']\n")
    resume, results = paused(
        monkeypatch, tmp_path, "profile", lambda: load_profile(str(folder / "site.yaml"))
    )
    swap(folder / "site.yaml", folder / "evil.yaml")
    resume()
    assert [p.setup for p in results] == [("echo mine",)]  # type: ignore[attr-defined]


@pytest.mark.parametrize(("mode", "refused"), [(0o755, False), (0o2775, True), (0o777, True)])
def test_profile_folder_mode_boundary(tmp_path: Path, mode: int, refused: bool) -> None:
    from hpcdist.errors import ProfileError
    from hpcdist.spec.profiles import load_profile

    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "site.yaml").write_text("partition: p\n")
    folder.chmod(mode)
    if refused:
        with pytest.raises(ProfileError) as caught:
            load_profile(str(folder / "site.yaml"))
        line = str(caught.value)
        assert f"the folder of profile '{folder / 'site.yaml'}', '{folder}', is writable" in line
        me = os.geteuid()
        assert f"owner {user_name(me)} (uid {me}), mode {mode:04o}" in line
        assert "--trust-profile" in line
        assert load_profile(str(folder / "site.yaml"), trust=True).partition == "p"
    else:
        assert load_profile(str(folder / "site.yaml")).partition == "p"


# ------------------------------------------------------------------ race 3: state location


@pytest.mark.parametrize(("mode", "shared"), [(0o755, False), (0o2775, True), (0o1777, False)])
def test_state_of_a_shared_folder_lives_in_the_users_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: int, shared: bool
) -> None:
    from hpcdist.state.folders import jobs_root, state_dir
    from hpcdist.state.statehome import private_state_root

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    folder = tmp_path / "project"
    folder.mkdir()
    folder.chmod(mode)
    sub = folder / "alice"  # a sticky folder protects the user's own folder in it
    sub.mkdir()
    base = sub if mode & 0o1000 else folder
    root = jobs_root(base)
    assert root == (private_state_root(base) if shared else base / ".hpcdist")
    made = state_dir("submitit", project_dir=base)
    assert made.is_dir() and (made.stat().st_mode & 0o777) == 0o700
    if shared:
        assert not (folder / ".hpcdist").exists()
        for level in (tmp_path / "state" / "hpcdist", root):
            assert level.stat().st_mode & 0o777 == 0o700, level


def test_the_users_state_folder_is_private_under_a_loose_umask(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hpcdist.state.folders import state_dir

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "home" / ".local" / "state"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir(mode=0o700)
    folder = tmp_path / "project"
    folder.mkdir()
    folder.chmod(0o2775)
    previous = os.umask(0o002)
    try:
        secrets = state_dir("secrets", project_dir=folder)
    finally:
        os.umask(previous)
    for level in (tmp_path / "home" / ".local", tmp_path / "home" / ".local" / "state"):
        assert level.stat().st_mode & 0o777 == 0o700, level
    (secrets / "s").write_text("x")
    (secrets / "s").chmod(0o600)
    from hpcdist.state.trustedfile import read_private

    assert read_private(secrets / "s", "job secret") == "x"  # checked from home down


def test_a_group_writable_folder_above_the_state_is_said_at_submit_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hpcdist.state.folders import state_dir

    home = tmp_path / "home"
    (home / ".local").mkdir(parents=True)
    home.chmod(0o700)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    folder = tmp_path / "project"
    folder.mkdir()
    folder.chmod(0o2775)
    assert state_dir("secrets", project_dir=folder).is_dir()  # ~/.local 0755: ok
    (home / ".local").chmod(0o775)
    with pytest.raises(PrivacyError, match=rf"'{home / '.local'}' is writable by group"):
        state_dir("secrets", project_dir=folder)


def test_rendered_script_keys_the_state_folder_as_python_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hpcdist.render.script import render
    from hpcdist.spec.options import spec_from_options
    from hpcdist.state.statehome import private_state_root

    folder = tmp_path / "my project+1"
    folder.mkdir()
    folder.chmod(0o2775)
    script = render(spec_from_options({"profile": "local", "mode": "threads", "nodes": 1}))
    # The script's own lines that make its state (jobstep prepare), then where it put it.
    block = script[script.index('prepared="') : script.index('eval "${prepared}"\n') + 19]
    block = script[script.index("hpcdist_main=") :].split("\n", 1)[0] + "\n" + block
    show = 'dirname "$(dirname "${HPCDIST_SECRET_FILE}")"'
    env = {
        **os.environ,
        "SLURM_JOB_ID": "77",
        "SLURM_SUBMIT_DIR": str(folder),
        "XDG_STATE_HOME": str(tmp_path),
    }
    env.pop("HPCDIST_HOME", None)
    out = subprocess.run(
        ["bash", "-c", block + show], env=env, capture_output=True, text=True, check=True
    )
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert out.stdout.strip() == str(private_state_root(folder))
    assert "hpcdist: note:" in out.stderr and "can be written by others" in out.stderr
    folder.chmod(0o755)
    out = subprocess.run(["bash", "-c", block + show], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == f"{folder}/.hpcdist" and not out.stderr


# ------------------------------------------------------------------ the lint


TRUSTED_MODULES = [
    "hpcdist/state/trustedfile.py",
    "hpcdist/state/private.py",
    "hpcdist/state/digests.py",
    "hpcdist/distributed/jobsecret.py",
    "hpcdist/state/statehome.py",
    "hpcdist/jobs/records.py",
    "hpcdist/spec/profiles/__init__.py",
    "hpcdist/state/folders.py",
    "ufsemulator/checkpoints/checkpoint.py",
    "ufsemulator/checkpoints/ckptwriter.py",
    "ufsemulator/training/runfiles.py",
    "ufsemulator/checkpoints/state.py",
]
# Reads that are not of trusted files, each with the reason it is allowed.
ALLOWED = {
    (
        "hpcdist/distributed/jobsecret.py",
        "read_text",
    ): "/proc/net/tcp: the kernel's, not a user's file",
    ("hpcdist/jobs/records.py", "read_text"): "exit codes and logs: shown, never run or resumed",
    ("hpcdist/state/folders.py", "read_text"): "never: listed so that a read would be seen",
}


def by_path_reads(source: str) -> list[tuple[int, str]]:
    """Calls that open or load a file by its path: open(), Path.open/read_text/read_bytes,
    torch.load() and yaml.*load() of anything but bytes in memory."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id == "open":
            found.append((node.lineno, "open"))
        elif isinstance(func, ast.Attribute):
            owner = func.value.id if isinstance(func.value, ast.Name) else ""
            if func.attr in ("read_text", "read_bytes") or (func.attr == "open" and owner != "os"):
                found.append((node.lineno, func.attr))
            elif owner == "torch" and func.attr == "load":
                arg = node.args[0] if node.args else None
                in_memory = (
                    isinstance(arg, ast.Call)
                    and isinstance(arg.func, ast.Attribute)
                    and arg.func.attr == "BytesIO"
                )
                if not in_memory:
                    found.append((node.lineno, "torch.load"))
            elif owner == "yaml" and "load" in func.attr:
                arg = node.args[0] if node.args else None
                opened = isinstance(arg, ast.Call) and isinstance(arg.func, ast.Name)
                if opened and arg.func.id == "open":  # type: ignore[union-attr]
                    found.append((node.lineno, "yaml.load(open())"))
    return found


def test_the_lint_finds_reads_by_path() -> None:
    bad = (
        "import torch, yaml\nopen('x')\nPath('x').read_text()\nPath('x').read_bytes()\n"
        "torch.load('x')\nyaml.safe_load(open('x'))\nPath('x').open()\n"
    )
    kinds = [kind for _, kind in by_path_reads(bad)]
    assert kinds.count("open") == 3 and "read_text" in kinds and "read_bytes" in kinds
    assert "torch.load" in kinds and "yaml.load(open())" in kinds
    good = "import io, os, torch\nos.open('x', 0)\ntorch.load(io.BytesIO(b''))\n"
    assert by_path_reads(good) == []


@pytest.mark.parametrize("module", TRUSTED_MODULES)
def test_trusted_file_modules_never_read_by_path(module: str) -> None:
    found = [
        (line, kind)
        for line, kind in by_path_reads((REPO / module).read_text())
        if (module, kind) not in ALLOWED
    ]
    assert found == [], f"{module} reads by path at {found}: use hpcdist.state.trustedfile"


@pytest.mark.parametrize(
    ("given", "config_dir", "resume", "source"),
    [
        ("runs/a", "runs/c", "r/checkpoint.pt", "argument"),
        (None, "runs/c", "r/checkpoint.pt", "config"),
        (None, None, "r/checkpoint.pt", "checkpoint"),
        (None, None, None, "job"),
    ],
)
def test_what_chose_the_run_folder_is_said_in_resolve_run_dirs_order(
    given: str | None, config_dir: str | None, resume: str | None, source: str
) -> None:
    from ufsemulator.config import Config, OutputConfig
    from ufsemulator.training.runfiles import run_dir_source

    config = Config(output=OutputConfig(run_dir=config_dir))
    assert run_dir_source(config, given, resume) == source
