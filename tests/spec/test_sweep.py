"""--set, --sweep, --max-parallel and --after: parsing, the schema check, the array script,
the same request to submitit, and their bad-input rows (one line, exit 2, nothing written)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpcdist.cli.main import cli
from hpcdist.errors import SpecError
from hpcdist.jobs.submit import describe, require_slurm_for_arrays
from hpcdist.render.script import render
from hpcdist.spec.dependency import dependency_value, parse_after
from hpcdist.spec.options import spec_from_options
from hpcdist.spec.sweep import points, split_values, task_command
from tests.render.test_render import PAYLOADS

SWEEP = {
    "profile": None,
    "mode": "gloo",
    "nodes": 2,
    "overrides": ("training.epochs=20",),
    "sweep": ("training.lr=1e-3,3e-3", "model.hidden_sizes=[32,32],[64,64]"),
    "max_parallel": 2,
}


@pytest.mark.parametrize(
    ("raw", "values"),
    [
        ("1e-3,3e-3", ("1e-3", "3e-3")),
        ("[32,32],[64,64]", ("[32,32]", "[64,64]")),
        ("[32, 32] , [64,[1,2]]", ("[32, 32]", "[64,[1,2]]")),
        ("'a,b',\"c,d\",e", ("'a,b'", '"c,d"', "e")),
        ("{a: 1, b: 2},x", ("{a: 1, b: 2}", "x")),
        ("null", ("null",)),
    ],
)
def test_sweep_values_split_at_top_level_commas_only(raw: str, values: tuple[str, ...]) -> None:
    assert split_values(raw, "--sweep k") == values


def test_points_are_the_product_in_flag_order_the_last_varying_fastest() -> None:
    spec = spec_from_options(dict(SWEEP))
    assert points(spec) == [
        ("training.lr=1e-3", "model.hidden_sizes=[32,32]"),
        ("training.lr=1e-3", "model.hidden_sizes=[64,64]"),
        ("training.lr=3e-3", "model.hidden_sizes=[32,32]"),
        ("training.lr=3e-3", "model.hidden_sizes=[64,64]"),
    ]
    assert task_command(spec, points(spec)[3])[-6:] == (
        "--set",
        "training.epochs=20",
        "--set",
        "training.lr=3e-3",
        "--set",
        "model.hidden_sizes=[64,64]",
    )


def test_render_writes_one_array_with_every_point_readable() -> None:
    script = render(spec_from_options(dict(SWEEP)))
    assert '#SBATCH --array="0-3%2"' in script
    assert "  0) point=(--set training.lr=1e-3 --set 'model.hidden_sizes=[32,32]') ;;" in script
    assert "  3) point=(--set training.lr=3e-3 --set 'model.hidden_sizes=[64,64]') ;;" in script
    assert 'python3 -m ufsemulator train --set training.epochs=20 "${point[@]}"' in script
    # A warned task requeues itself alone (hpcdist.distributed.requeue, which
    # tests/distributed/test_requeue.py runs against stand-in scontrol and sbatch).
    assert (
        'jobstep run --warning=USR2@90 --requeue --terminated="${terminated}" --max-restarts=3 '
        in script
    )


def test_a_job_without_sweep_renders_no_array_and_requeues_its_job_id() -> None:
    script = render(spec_from_options({"profile": None, "mode": "gloo"}))
    assert "--array" not in script and "point=(" not in script and "--dependency" not in script
    assert (
        "jobstep run --warning=USR2@90 --requeue " in script
    )  # requeues SLURM_JOB_ID (test_requeue.py)


@pytest.mark.parametrize("task", [0, 1, 3])
def test_each_array_task_gets_its_own_point_and_an_unknown_task_fails(
    task: int, tmp_path: Path
) -> None:
    script = render(spec_from_options(dict(SWEEP)))
    probe = "\n".join([*point_case(script), 'printf "%s\\n" "${point[@]}"'])
    run = subprocess.run(
        ["bash", "-c", probe],
        env={"SLURM_ARRAY_TASK_ID": str(task)},
        capture_output=True,
        text=True,
    )
    lr, sizes = [("1e-3", "32"), ("1e-3", "64"), ("3e-3", "32"), ("3e-3", "64")][task]
    assert run.stdout.splitlines() == [
        "--set",
        f"training.lr={lr}",
        "--set",
        f"model.hidden_sizes=[{sizes},{sizes}]",
    ]
    missing = subprocess.run(
        ["bash", "-c", probe], env={"SLURM_ARRAY_TASK_ID": "4"}, capture_output=True, text=True
    )
    assert missing.returncode == 2
    assert "array task '4' (first point 0) is not a point of this sweep" in missing.stderr


def point_case(script: str) -> list[str]:
    """The script's lines that pick an array task's point: from the offset to the case."""
    lines = script.splitlines()
    start = next(n for n, ln in enumerate(lines) if ln.startswith('case "${HPCDIST_SWEEP_OFFSET'))
    first_end = lines.index("esac", start)
    return lines[start : lines.index("esac", first_end + 1) + 1]


@pytest.mark.parametrize(
    ("offset", "task", "point"),
    [("0", "3", 3), ("2", "0", 2), ("2", "1", 3), ("", "1", 1), ("3", "1", None), ("x", "0", None)],
)
def test_a_part_of_a_split_sweep_finds_its_points_at_its_offset(
    offset: str, task: str, point: int | None
) -> None:
    probe = "\n".join([*point_case(render(spec_from_options(dict(SWEEP)))), 'echo "${point[1]}"'])
    env = {"SLURM_ARRAY_TASK_ID": task, "HPCDIST_SWEEP_OFFSET": offset}
    run = subprocess.run(["bash", "-c", probe], env=env, capture_output=True, text=True)
    values = ["training.lr=1e-3", "training.lr=1e-3", "training.lr=3e-3", "training.lr=3e-3"]
    if point is None:
        assert run.returncode == 2
        assert f"array task '{task}' (first point {offset or 0})" in run.stderr
    else:
        assert (run.returncode, run.stdout.strip()) == (0, values[point])


@pytest.mark.parametrize("payload", PAYLOADS)
def test_override_values_reach_the_training_as_they_were_given(
    payload: str, tmp_path: Path
) -> None:
    marker = tmp_path / "pwned"
    value = payload.replace("MARKER", str(marker))
    try:
        spec = spec_from_options({"profile": None, "overrides": (f"output.run_dir={value}",)})
    except SpecError:
        return  # refused (not a YAML value): inert as well
    script = render(spec)
    launch = next(line for line in script.splitlines() if "ufsemulator train" in line)
    words = launch.strip().removesuffix(" || status=$?")
    run = subprocess.run(["bash", "-c", f"printf '%s\\n' {words}"], capture_output=True, text=True)
    assert run.stdout.splitlines()[-2:] == ["--set", f"output.run_dir={value}"]
    assert not marker.exists()


@pytest.mark.parametrize("payload", [p for p in PAYLOADS if "," not in p])
def test_swept_values_reach_their_array_task_as_they_were_given(
    payload: str, tmp_path: Path
) -> None:
    marker = tmp_path / "pwned"
    value = payload.replace("MARKER", str(marker))
    try:
        spec = spec_from_options({"profile": None, "sweep": (f"data.path=null,{value}",)})
    except SpecError:
        return  # refused (not a YAML value, unbalanced brackets): inert as well
    probe = "\n".join([*point_case(render(spec)), 'printf "%s\\n" "${point[@]}"'])
    run = subprocess.run(
        ["bash", "-c", probe], env={"SLURM_ARRAY_TASK_ID": "1"}, capture_output=True, text=True
    )
    assert run.stdout.splitlines() == ["--set", f"data.path={value}"]
    assert not marker.exists()


@pytest.mark.parametrize(
    ("after", "value"),
    [
        (("123",), "afterok:123"),
        (("123:ok", "456"), "afterok:123:456"),
        (("123:any", "7_2:notok", "8:ok"), "afterany:123,afternotok:7_2,afterok:8"),
        (("123", "123:ok"), "afterok:123"),
    ],
)
def test_after_becomes_one_dependency_directive(after: tuple[str, ...], value: str) -> None:
    assert dependency_value(parse_after(after)) == value
    spec = spec_from_options({"profile": None, "after": after})
    assert f'#SBATCH --dependency="{value}"' in render(spec)


def test_submit_plans_the_array_and_dependency_the_script_renders(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spec = spec_from_options({**SWEEP, "after": ("123:any",)})
    monkeypatch.setattr("shutil.which", lambda name: f"/usr/bin/{name}")
    script = describe(spec, "slurm")["script"]
    assert script == render(spec)
    assert '#SBATCH --array="0-3%2"' in script and '#SBATCH --dependency="afterany:123"' in script


def test_a_sweep_or_after_is_refused_by_the_local_executor() -> None:
    for flags in (dict(SWEEP), {"profile": None, "after": ("12",)}):
        spec = spec_from_options(flags)
        with pytest.raises(SpecError, match="needs SLURM"):
            require_slurm_for_arrays(spec, "local")
        require_slurm_for_arrays(spec, "slurm")
        with pytest.raises(SpecError, match="needs SLURM"):
            describe(spec, "local")


ALLOWED = "epochs, batch_size, lr, weight_decay"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--set", "training.lrr=1"],
            f"--set: unknown key 'training.lrr' in config; allowed in 'training': {ALLOWED}",
        ),
        (
            ["--set", "trainig.lr=1"],
            "--set: unknown key 'trainig' in config; allowed in 'config': data, model",
        ),
        (["--set", "training.lr=abc"], "--set: 'training.lr' must be a number, got 'abc'"),
        (["--set", "training.epochs=1.5"], "--set: 'training.epochs' must be an integer, got 1.5"),
        (["--set", "training.epochs=0"], "--set: 'training.epochs' must be >= 1, got 0"),
        (
            ["--set", "model.hidden_sizes=64"],
            "--set: 'model.hidden_sizes' must be a non-empty list, got 64",
        ),
        (
            ["--set", "training.lr.x=1"],
            "--set: 'training.lr.x': 'training.lr' is a value, not a section",
        ),
        (["--set", "lr"], "--set 'lr'; expected KEY=VALUE with a dotted config key"),
        (
            ["--set", "$(touch x)=1"],
            "--set '$(touch x)=1'; expected KEY=VALUE with a dotted config key",
        ),
        (["--set", "training.lr=[1,"], "--set training.lr='[1,' is not a YAML value"),
        (["--set", "data.path=a\nb"], "--set data.path='a\\\\nb' contains a newline or NUL"),
        (
            ["--set", "training.lr=1", "--command", "hostname"],
            "--set and --sweep change the training config, but the command is 'hostname'",
        ),
        (
            ["--mode", "test", "--set", "training.lr=1"],
            "--set and --sweep change the training config",
        ),
        (
            ["--sweep", "training.lr=1e-3,abc"],
            "sweep point 1 (training.lr=abc): 'training.lr' must be a number, got 'abc'",
        ),
        (
            ["--sweep", "training.lrr=1,2"],
            "sweep point 0 (training.lrr=1): unknown key 'training.lrr'",
        ),
        (
            ["--sweep", "model.hidden_sizes=[32,32],[64,64"],
            "--sweep 'model.hidden_sizes=[32,32],[64,64' has an unclosed '['",
        ),
        (["--sweep", "model.hidden_sizes=[32,32]],[64]"], "has an unbalanced ']'"),
        (["--sweep", "training.lr=1,,2"], "has an empty value"),
        (
            ["--sweep", "training.lr"],
            "--sweep 'training.lr'; expected KEY=V1,V2,... with a dotted config key",
        ),
        (["--sweep", 'x"; rm -rf ~ #=1,2'], "expected KEY=V1,V2,... with a dotted config key"),
        (["--sweep", "training.lr=1"], "the sweep has 1 point (training.lr=1); expected 2 or more"),
        (["--sweep", "training.lr=1,1"], "--sweep 'training.lr=1,1' repeats a value"),
        (
            ["--sweep", "training.lr=1,2", "--sweep", "training.lr=3,4"],
            "--sweep training.lr is given twice",
        ),
        (
            ["--sweep", "training.lr=1,2", "--set", "training.lr=3"],
            "--set training.lr is also swept",
        ),
        (
            ["--sweep", "output.run_dir=a,b"],
            "output.run_dir with --sweep would give every point one run folder",
        ),
        (
            ["--sweep", "model.hidden_sizes=[32,0],[64]"],
            "sweep point 0 (model.hidden_sizes=[32,0]): 'model.hidden_sizes' entries must be >= 1",
        ),
        (
            [
                "--sweep",
                "training.seed=0,1",
                "--sweep",
                "training.lr=" + ",".join(f"{i}e-5" for i in range(25_001)),
            ],
            "the sweep has 50002 points; expected at most 50000",
        ),
        (["--max-parallel", "2"], "--max-parallel 2 needs --sweep"),
        (
            ["--sweep", "training.lr=1,2", "--max-parallel", "0"],
            "--max-parallel must be >= 1, got 0",
        ),
        (["--after", "abc"], "--after 'abc'; expected JOB[:ok|any|notok]"),
        (["--after", "12:maybe"], "--after '12:maybe'; expected JOB[:ok|any|notok]"),
        (["--after", "0"], "--after '0'; expected JOB[:ok|any|notok]"),
        (["--after", "12;touch x"], "--after '12;touch x'; expected JOB[:ok|any|notok]"),
        (["--after", "12_"], "--after '12_'; expected JOB[:ok|any|notok]"),
    ],
)
@pytest.mark.parametrize("command", ["render", "submit"])
def test_bad_sweep_set_and_after_values_are_one_line_exit_2_and_write_nothing(
    args: list[str], message: str, command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    extra = ["--script", str(tmp_path / "job.sh")] if command == "render" else ["--dry-run"]
    result = CliRunner().invoke(cli, [command, *args, *extra])
    assert result.exit_code == 2, result.output
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("hpcdist: error: ")
    assert message in result.stderr, result.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_plain_render_reads_no_training_config() -> None:
    code = (
        "import sys; from hpcdist.cli.main import main; code = main(['render', '--nodes', '2']); "
        "assert code == 0; assert 'ufsemulator.config' not in sys.modules"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_render_and_submit_of_a_sweep_import_neither_torch_nor_matplotlib() -> None:
    code = (
        "import sys; from hpcdist.cli.main import main; "
        "code = main(['render', '--sweep', 'training.lr=1e-3,3e-3', '--set', "
        "'model.hidden_sizes=[8,8]', '--after', '12']); "
        "code2 = main(['submit', '--dry-run', '--executor', 'local', '--set', 'training.lr=1']); "
        "assert (code, code2) == (0, 0), (code, code2); "
        "heavy = [m for m in ('torch', 'matplotlib', 'netCDF4') if m in sys.modules]; "
        "assert not heavy, heavy"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
