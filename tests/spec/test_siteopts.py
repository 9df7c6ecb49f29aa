"""Site options: pass-through (--sbatch, --srun-arg), first-class site flags, the GPU request
shape, rank logs and containers; each checked, merged built-in < profile < flags, quoted."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from hpcdist.cli.main import cli
from hpcdist.errors import SpecError
from hpcdist.render.directives import sbatch_directives, srun_options
from hpcdist.render.script import quote, render
from hpcdist.spec.options import spec_from_options
from tests.jobs.test_submit import _directives
from tests.render.test_render import PAYLOADS, _bash_n, _run_script

SITE_PROFILE = {
    "partition": "gpu",
    "cores_per_node": 64,
    "gpus_per_node": 4,
    "gpu_request": "gres",
    "gpu_types": ["a100", "h100"],
    "features": ["a100", "ib", "testbed"],
    "sbatch": {"comment": "from-profile", "licenses": "matlab:1", "hint": None},
    "srun_args": ["--distribution=block"],
    "container": {
        "runtime": "apptainer",
        "image": "/images/torch.sif",
        "mounts": ["/scratch"],
        "options": ["--writable-tmpfs"],
    },
}


@pytest.fixture
def site(tmp_path: Path) -> str:
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(SITE_PROFILE))
    return str(path)


# (flags for `hpcdist render`, fragment the one-line error must contain)
BAD_SITE_REQUESTS: list[tuple[list[str], str]] = [
    (["--sbatch", "nodes=4"], "--sbatch 'nodes' is hpcdist's own option; use --nodes instead"),
    (["--sbatch", "ntasks=8"], "--sbatch 'ntasks' is hpcdist's own option; use --ntasks"),
    (
        ["--sbatch", "ntasks-per-socket=1"],
        "--sbatch 'ntasks-per-socket' counts tasks per socket, a layout hpcdist does not make: "
        "it gives each node --tasks-per-node tasks of --cpus-per-task CPUs each",
    ),
    (["--sbatch", "ntasks-per-s=1"], "--sbatch 'ntasks-per-s' counts tasks per socket, a"),
    (["--sbatch", "cpus-per-gpu=4"], "--sbatch 'cpus-per-gpu' counts CPUs per GPU, a layout"),
    (["--sbatch", "gpus-per-socket=1"], "--sbatch 'gpus-per-socket' counts GPUs per socket"),
    (["--sbatch", "ntasks-per-node=2"], "--sbatch 'ntasks-per-node' is hpcdist's own option; use"),
    (["--sbatch", "time=10"], "use --time instead"),
    (["--sbatch", "partition=x"], "use --partition instead"),
    (["--sbatch", "--job-name=x"], "--sbatch 'job-name' is hpcdist's own option; use --job-name"),
    (["--sbatch", "signal=USR1@60"], "use --signal instead"),
    (["--sbatch", "requeue"], "use --requeue instead"),
    (["--sbatch", "array=0-3"], "'array' is hpcdist's own option"),
    (["--sbatch", "dependency=afterok:1"], "'dependency' is hpcdist's own option"),
    (["--sbatch", "constraint=ib"], "use --constraint instead"),
    (["--sbatch", "mem=4G"], "use --mem instead"),
    (["--sbatch", "open-mode=truncate"], "use hpcdist's own --open-mode=append"),
    # sbatch takes unique abbreviations: --nod is --nodes.
    (["--sbatch", "nod=4"], "--sbatch 'nod' is hpcdist's own option; use --nodes instead"),
    (
        ["--mode", "nccl", "--gpus-per-node", "2", "--sbatch", "gres=gpu:2"],
        "--sbatch 'gres' is hpcdist's own option; use --gpus-per-node and --gpu-type",
    ),
    (["--sbatch", "co mment=x"], "--sbatch key 'co mment' is not an sbatch long option"),
    (["--sbatch", "x;y=1"], "--sbatch key 'x;y' is not an sbatch long option"),
    (["--sbatch", "Comment=x"], "--sbatch key 'Comment' is not an sbatch long option"),
    (["--sbatch", "=x"], "--sbatch key '' is not an sbatch long option"),
    (["--sbatch", "comment=a\nb"], "--sbatch 'comment=a\\nb' contains a newline or NUL"),
    (["--srun-arg", "--ntasks=3"], "--srun-arg '--ntasks=3' is hpcdist's own srun option"),
    (["--srun-arg", "-l"], "--srun-arg '-l' is hpcdist's own srun option; use --rank-logs label"),
    (["--srun-arg", "cores"], "--srun-arg 'cores' is not one srun option"),
    (["--srun-arg", "--cpu-bind cores"], "--srun-arg '--cpu-bind cores' is not one srun option"),
    (["--srun-arg", "--x=a\nb"], "--srun-arg '--x=a\\nb' contains a newline or NUL"),
    (["--gpu-type", "a100"], "--gpu-type 'a100' needs GPUs: expected --mode nccl"),
    (
        ["--profile", "cpu-cluster", "--gpu-type", "a100"],
        "--gpu-type 'a100' needs GPUs: expected --mode nccl, or --mode test with "
        "--gpus-per-node (got --mode gloo, profile 'cpu-cluster')",
    ),
    (["--mode", "nccl", "--gpu-type", "a100"], "--gpu-type 'a100' needs a GPU count"),
    (["--mode", "nccl", "--gpus-per-node", "1", "--gpu-type", "a 100"], "--gpu-type 'a 100'"),
    (["--gpu-request", "gpus"], "'gpus' is not one of"),
    (["--mem-per-gpu", "40G"], "--mem-per-gpu '40G' needs GPUs; the job asks for none"),
    (
        ["--mode", "nccl", "--gpus-per-node", "1", "--mem-per-gpu", "lots"],
        "--mem-per-gpu 'lots' is not a SLURM memory size",
    ),
    (
        ["--mode", "nccl", "--gpus-per-node", "1", "--mem-per-gpu", "4G", "--mem", "8G"],
        "--mem '8G' and --mem-per-gpu '4G'; expected one of them",
    ),
    (
        ["--mail-type", "END,SOMETIMES"],
        "--mail-type 'END,SOMETIMES': 'SOMETIMES' is not a SLURM mail",
    ),
    (["--mail-user", "a b@x.org"], "--mail-user 'a b@x.org'; expected one address"),
    (["--nodelist", "node[1-"], "unbalanced '[' in --nodelist 'node[1-'"),
    (["--exclude", "node[3-1]"], "--exclude"),
    (["--constraint", "ib;rm"], "--constraint 'ib;rm' is not a SLURM constraint; expected"),
    (["--constraint", "&&"], "--constraint '&&' is not a SLURM constraint"),
    (["--constraint", "a100&&ib"], "--constraint 'a100&&ib' is not a SLURM constraint"),
    (["--nodelist", "$(touch pwned)"], "--nodelist '$(touch pwned)' is not a SLURM node list"),
    (["--exclude", "a'b"], '--exclude "a\'b" is not a SLURM node list'),
    (["--nodes", "2", "--nodelist", "node[1-2,4]"], "--nodelist 'node[1-2,4]' names 3 nodes"),
    (["--exclusive=topo"], "--exclusive 'topo' is not a SLURM --exclusive kind"),
    (["--array", "1-0"], "--array '1-0' is not a SLURM job array"),
    (["--array", "0-15:0"], "--array '0-15:0' is not a SLURM job array"),
    (["--array", "0-1001"], "--array '0-1001' has task id 1001; expected ids up to 1000"),
    (["--array", "0-3%x"], "--array '0-3%x': the limit after % must be a number"),
    (["--mail-type", ","], "--mail-type ',' names no mail type"),
    (["--cpu-bind", "cores;x"], "--cpu-bind 'cores;x'; expected srun's binding"),
    (["--gpu-bind", "closest"], "--gpu-bind 'closest' needs GPUs"),
    (["--rank-logs", "both"], "'both' is not one of"),
    (["--container-mount", "/a:/b"], "--container-mount/--container-option without an image"),
    (["--container", "img.sif", "--container-option", "--cleanenv"], "would hide the job's"),
    (["--container", "img.sif", "--container-mount", "a:b:c:d"], "--container-mount 'a:b:c:d'"),
    (
        ["--container", "img", "--container-runtime", "pyxis", "--container-mount", "/a,/b"],
        "--container-mount '/a,/b'; expected SRC[:DST[:OPTS]]",
    ),
    (["--container-runtime", "docker"], "'docker' is not one of"),
]


@pytest.mark.parametrize(("args", "message"), BAD_SITE_REQUESTS)
def test_bad_site_request_is_one_line_exit_2_nothing_written(
    args: list[str], message: str, tmp_path: Path
) -> None:
    out = tmp_path / "job.sh"
    result = CliRunner().invoke(cli, ["render", *args, "--script", str(out)])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("hpcdist: error: ")
    assert message in lines[0]
    assert result.stdout == ""
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gpu-type", "v100"], "--gpu-type 'v100' is not in profile 'site'; expected one of"),
        (["--constraint", "a100&nvme"], "feature 'nvme' is not in profile 'site'"),
        (["--sbatch", "gres=gpu:8"], "use --gpus-per-node and --gpu-type instead"),
    ],
)
def test_site_profile_limits_are_checked(site: str, args: list[str], message: str) -> None:
    result = CliRunner().invoke(cli, ["render", "--profile", site, "--mode", "nccl", *args])
    assert result.exit_code == 2
    assert message in result.stderr


def test_gres_passes_through_when_hpcdist_asks_for_no_gpus() -> None:
    spec = spec_from_options({"profile": None, "mode": "gloo", "sbatch_options": ("gres=nvme:1",)})
    assert _directives(render(spec))["gres"] == "nvme:1"


def test_profile_then_flags_win_over_built_in_rows(site: str) -> None:
    spec = spec_from_options(
        {
            "profile": site,
            "mode": "nccl",
            "sbatch_options": ("comment=from-flag", "--begin=now+1"),
            "srun_args": ("--cpu-bind=cores",),
        }
    )
    rows = {d.option: d.value for d in sbatch_directives(spec)}
    # The flag's comment over the profile's; the profile's other keys stay.
    assert rows["comment"] == "from-flag"
    assert rows["licenses"] == "matlab:1"
    assert rows["begin"] == "now+1"
    assert "hint" in rows and rows["hint"] is None
    assert [d.option for d in sbatch_directives(spec)].count("comment") == 1
    # srun: hpcdist's options, then the profile's srun_args, then --srun-arg.
    words = srun_options(spec)
    assert words[-2:] == ["--distribution=block", "--cpu-bind=cores"]
    # The profile asks for GPUs as gres.
    assert rows["gres"] == "gpu:4" and "gpus-per-node" not in rows


@pytest.mark.parametrize(
    ("flags", "directive", "value"),
    [
        ({"gpus_per_node": 2}, "gpus-per-node", 2),
        ({"gpus_per_node": 2, "gpu_type": "a100"}, "gres", "gpu:a100:2"),
        ({"gpus_per_node": 4, "gpu_request": "gres"}, "gres", "gpu:4"),
        ({"gpus_per_node": 2, "gpu_request": "gpus-per-task"}, "gpus-per-task", 1),
        (
            {"gpus_per_node": 4, "gpu_request": "gpus-per-task", "gpu_type": "h100"},
            "gpus-per-task",
            "h100:1",
        ),
        # One torchrun per node: its one task holds the node's 4 GPUs.
        (
            {"gpus_per_node": 4, "gpu_request": "gpus-per-task", "launcher": "torchrun"},
            "gpus-per-task",
            4,
        ),
    ],
)
def test_gpu_request_shape(flags: dict[str, Any], directive: str, value: object) -> None:
    spec = spec_from_options({"profile": "gpu-cluster", "mode": "nccl", **flags})
    rows = {d.option: d.value for d in sbatch_directives(spec)}
    assert rows[directive] == value
    others = {"gpus-per-node", "gres", "gpus-per-task"} - {directive}
    assert not others & set(rows)


def test_first_class_site_flags_render_as_given() -> None:
    spec = spec_from_options(
        {
            "profile": "gpu-cluster",
            "mode": "nccl",
            "nodes": 2,
            "constraint": "a100&ib",
            "exclusive": True,
            "reservation": "maint window",
            "mem_per_gpu": "40G",
            "mail_type": "END,FAIL",
            "mail_user": "me@site.org",
            "nodelist": "gpu[01-02]",
            "exclude": "gpu07",
            "gpu_bind": "closest",
            "cpu_bind": "map_cpu:0,1",
        }
    )
    script = render(spec)
    found = _directives(script)
    assert found["constraint"] == "a100&ib"
    assert found["exclusive"] == ""
    assert found["reservation"] == "maint window"  # as sbatch's parser reads it back
    assert '#SBATCH --reservation="maint window"' in script
    assert found["mem-per-gpu"] == "40G" and "mem" not in found  # replaces the profile's 0
    assert found["mail-type"] == "END,FAIL" and found["mail-user"] == "me@site.org"
    assert found["nodelist"] == "gpu[01-02]" and found["exclude"] == "gpu07"
    srun = next(ln.strip() for ln in script.splitlines() if ln.lstrip().startswith("srun "))
    assert "--cpu-bind=map_cpu:0,1 --gpu-bind=closest" in srun


# Every new field that reaches the script as text, and how the payload shows in it.
INJECTABLE = [
    "sbatch_options",
    "srun_args",
    "reservation",
    "mail_user",
    "constraint",
    "nodelist",
    "exclude",
    "cpu_bind",
    "gpu_type",
    "container",
    "container_mounts",
    "container_options",
]


def _payload_flags(field: str, value: str) -> dict[str, Any]:
    return {
        "sbatch_options": {"sbatch_options": (f"comment={value}",)},
        "srun_args": {"srun_args": (f"--comment={value}",)},
        "container": {"container": value},
        "container_mounts": {"container": "c.sif", "container_mounts": (f"/x:{value}",)},
        "container_options": {"container": "c.sif", "container_options": (f"--home={value}",)},
    }.get(field, {field: value})


@pytest.mark.parametrize("field", INJECTABLE)
@pytest.mark.parametrize("payload", PAYLOADS)
def test_site_values_never_execute(field: str, payload: str, tmp_path: Path) -> None:
    marker = tmp_path / "MARKER"
    value = payload.replace("MARKER", str(marker))
    try:
        spec = spec_from_options({"profile": None, "mode": "gloo", **_payload_flags(field, value)})
    except SpecError:
        # Refused (constraint, binding, GPU type, node names have a syntax): never in a script.
        assert field not in ("sbatch_options", "srun_args", "reservation", "container"), field
        return
    script = render(spec)
    assert _bash_n(script, tmp_path).returncode == 0
    proc, argv = _run_script(script, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert not marker.exists(), f"{field} payload {payload!r} executed"
    flags = _payload_flags(field, value)
    if field == "srun_args":
        assert f"--comment={value}" in argv
    elif field.startswith("container"):
        word = {
            "container": value,
            "container_mounts": f"--bind=/x:{value}",
            "container_options": f"--home={value}",
        }[field]
        assert word in argv, argv
    else:
        # A directive: sbatch's own parser reads the value back whole.
        option, text = (
            ("comment", value)
            if field == "sbatch_options"
            else (field.replace("_", "-"), flags[field])
        )
        line = f"#SBATCH --{option}={quote(text, 'sbatch')}"
        assert line in script.splitlines()


def test_submit_queues_the_site_options_render_writes_with_their_values(
    site: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.jobs.test_submit import _planned, _srun_line

    spec = spec_from_options(
        {
            "profile": site,
            "mode": "nccl",
            "gpus_per_node": 2,
            "gpu_type": "a100",
            "constraint": "a100&ib",
            "exclusive": True,
            "reservation": "rsv 1",
            "mail_type": "END",
            "mail_user": "me@site.org",
            "exclude": "gpu07",
            "cpu_bind": "cores",
            "sbatch_options": ('comment=it\'s "quoted"',),
            "srun_args": ("--export=ALL,X=a b",),
        }
    )
    monkeypatch.setattr("shutil.which", lambda name: f"/usr/bin/{name}")
    submitted_text = _planned(spec)
    assert submitted_text == render(spec)
    submitted = _directives(submitted_text)
    for option, value in {
        "gres": "gpu:a100:2",
        "constraint": "a100&ib",
        "exclusive": "",
        "reservation": "rsv 1",
        "mail-type": "END",
        "mail-user": "me@site.org",
        "exclude": "gpu07",
        "comment": 'it\'s "quoted"',
        "hint": "",
    }.items():
        assert submitted[option] == value, option
    srun = _srun_line(submitted_text)
    words = shlex.split(srun)
    for word in ("--cpu-bind=cores", "--distribution=block", "--export=ALL,X=a b"):
        assert word in words
    # The container wraps the command the submitted job runs, as in the script.
    from hpcdist.render.container import container_prefix

    assert container_prefix(spec)[:3] == ["apptainer", "exec", "--nv"]
    assert re.search(r"apptainer exec --nv .*/images/torch.sif python3", render(spec))


def _readme_site_profile(tmp_path: Path) -> str:
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = text.split("```yaml\n# site.yaml", 1)[1].split("```", 1)[0]
    path = tmp_path / "site.yaml"
    path.write_text("# site.yaml" + block)
    return str(path)


def test_readme_site_profile_renders_gpu_and_cpu_jobs(tmp_path: Path) -> None:
    site = _readme_site_profile(tmp_path)
    gpu = render(spec_from_options({"profile": site, "mode": "nccl", "nodes": 2}))
    found = _directives(gpu)
    assert found["gres"] == "gpu:a100:4" and found["constraint"] == "ib"
    assert found["comment"] == "emulator" and found["hint"] == "nomultithread"
    assert found["account"] == "proj123" and found["mail-type"] == "END,FAIL"
    assert "apptainer exec --nv --bind=/scratch --writable-tmpfs /sw/images/torch-2.13.sif" in gpu
    # The profile's GPU type is for its GPU jobs: a CPU job on it asks for no GPU.
    cpu = _directives(render(spec_from_options({"profile": site, "mode": "gloo"})))
    assert "gres" not in cpu and cpu["constraint"] == "ib"
