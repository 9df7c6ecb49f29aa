"""A run on real CICE files records what it read: the log line, training_results.json with
absolute paths and only the blocks that apply, and model.pt's provenance and ranges."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from ufsemulator.__main__ import main
from ufsemulator.export.torchscript import read_extra_files

REPO = Path(__file__).resolve().parents[3]
SMOKE = REPO / "ufsemulator" / "configs" / "smoke.yaml"


@pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning")
def test_a_daily_stream_run_records_its_data_and_provenance(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HPCDIST_DATA_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    argv = ["make-data", "--out", "iceh_d.nc", "--layout", "daily", "--records", "2"]
    assert main([*argv, "--files", "2", "--ni", "40", "--nj", "32"]) == 0
    files = sorted(str(p) for p in tmp_path.glob("iceh_d.000*.nc"))
    assert len(files) == 2
    run = tmp_path / "run"
    train = ["train", "--config", str(SMOKE), "--data", *files, "--run-dir", "run"]
    packaged: list[Path] = []
    monkeypatch.setattr(
        "ufsemulator.export.aoti.package_export", lambda pt, out: packaged.append(Path(out)) or out
    )
    sets = ["--set", "data.time='1:4'", "--set", "export.names=jedi", "--set", "export.aoti=true"]
    assert main([*train, "--epochs", "1", *sets]) == 0
    out = capsys.readouterr().out
    # Records 1, 2 and 3 of the four (the second of the first file, both of the second).
    assert "Read records 1..3 (3 of a 32x40 grid, 2000-01-03T00:00:00 .. " in out
    one = tmp_path / "one"
    assert main(["train", "--config", str(SMOKE), "--data", files[0], "--run-dir", str(one)]) == 0
    times = "2000-01-02T00:00:00 .. 2000-01-03T00:00:00"
    line = f"Data: {files[0]}, records 0..1 (2 of a 32x40 grid, {times}) (372 points"
    assert line in capsys.readouterr().out
    text = (run / "training_results.json").read_text()
    results = json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in JSON"))
    assert results["config"]["export"]["fill_value"] is None  # NaN
    assert results["config"]["data"]["path"] == [str(Path(f).resolve()) for f in files]
    assert "synthetic" not in results["config"]["data"]
    data = results["data"]
    assert data["synthetic"] is False and len(data["sha256"]) == 64
    assert data["files_sha256"] == [hashlib.sha256(Path(f).read_bytes()).hexdigest() for f in files]
    assert data["first_record_time"].startswith("2000-01-03")
    assert data["first_record_time"] < data["last_record_time"]
    extra = read_extra_files(run / "model.pt")
    origin = json.loads(extra["provenance.json"])
    assert origin["training_data"]["sha256"] == data["sha256"]
    assert origin["metrics"]["epochs_run"] == 1 and origin["metrics"]["best_val_loss"] > 0
    assert origin["config"]["export"]["names"] == "jedi"
    sig = json.loads(extra["signature.json"])
    sst = sig["inputs"][0]
    assert (sst["name"], sst["unit"]) == ("sea_water_potential_temperature", "degC")
    assert -5.0 < sst["train_min"] < sst["train_max"] < 40.0  # a range, in SOCA's degC
    tair = sig["inputs"][2]
    assert (tair["name"], tair["unit"]) == ("air_temperature", "K")
    assert 200.0 < tair["train_min"] < tair["train_max"] < 320.0  # a range, in K
    assert (run / "model.md").read_text().count("sea_water_potential_temperature") == 1
    assert [p.resolve() for p in packaged] == [run / "model.pt2"]  # export.aoti: beside model.pt
    _re_export_keeps_the_provenance(run, files, capsys)


def _re_export_keeps_the_provenance(
    run: Path, files: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """export --checkpoint (the documented re-export route) records the run's data and
    metrics; --describe prints each file's digest as sha256sum prints it, and the config."""
    again = run / "again.pt"
    assert main(["export", "--checkpoint", str(run / "best_model.pt"), "--out", str(again)]) == 0
    before = json.loads(read_extra_files(run / "model.pt")["provenance.json"])
    after = json.loads(read_extra_files(again)["provenance.json"])
    for key in ("training_data", "metrics", "config"):
        assert after[key] == before[key] and after[key], key
    capsys.readouterr()
    assert main(["export", "--describe", str(again)]) == 0
    described = capsys.readouterr().out
    sha256sum = subprocess.run(["sha256sum", *files], capture_output=True, text=True, check=True)
    for line in sha256sum.stdout.splitlines():
        digest, path = line.split(maxsplit=1)
        assert f"    {digest}  {Path(path).resolve()}" in described
    assert "    training: epochs 1, batch_size 100" in described
    assert '    export: names "jedi"' in described and "epochs_run 1" in described
    _re_export_refuses_results_changed_since(run, capsys)


def _re_export_refuses_results_changed_since(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """training_results.json changed after the training wrote it (its digest no longer
    matches): the export goes on, says so, and records no data or metrics from it."""
    results = run / "training_results.json"
    forged = json.loads(results.read_text())
    forged["data"]["sha256"] = "0" * 64
    results.write_text(json.dumps(forged))
    forged_out = run / "forged.pt"
    argv = ["export", "--checkpoint", str(run / "best_model.pt"), "--out", str(forged_out)]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert f"Warning: refusing training results {str(results)!r}" in err
    assert "the export records no data or metrics" in err
    origin = json.loads(read_extra_files(forged_out)["provenance.json"])
    assert origin["training_data"] is None and origin["metrics"] is None


def test_a_bad_export_setting_fails_before_any_data_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HPCDIST_DATA_DIR", str(tmp_path / "cache"))
    argv = ["train", "--config", str(SMOKE), "--run-dir", str(tmp_path / "run")]
    assert main([*argv, "--set", "export.units={sst: m}"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "error: export.units gives sst in 'm', but its exported name 'sst' carries degC: "
        "names fix units; drop export.units or choose the name of that unit\n"
    )
    assert not (tmp_path / "cache").exists()  # not even the synthetic file was made
    assert not (tmp_path / "run" / "checkpoint.pt").exists()
    assert os.environ.get("RANK") is None


def test_a_checkpoint_from_before_ranges_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    monkeypatch.setenv("HPCDIST_DATA_DIR", str(tmp_path / "cache"))
    argv = ["train", "--config", str(SMOKE), "--run-dir", str(tmp_path / "run"), "--epochs", "1"]
    assert main(argv) == 0
    checkpoint = tmp_path / "run" / "checkpoint.pt"
    state = torch.load(checkpoint, weights_only=True)
    low = state["model"].pop("input_min")
    del state["model"]["input_max"]
    torch.save(state, checkpoint)
    assert main(["train", "--resume", str(checkpoint), "--epochs", "2"]) == 0
    resumed = torch.load(checkpoint, weights_only=True)["model"]["input_min"]
    assert torch.equal(resumed, low)  # the same files give the same range
