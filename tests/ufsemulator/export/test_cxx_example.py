"""The C++ example (examples/cxx): built with CMake against the LibTorch inside the installed
torch wheel, it loads an export as SABER's TorchBalance does; its answers must be Python's.

Marked ``cxx``: it needs cmake and a C++17 compiler (scripts/run-tests installs cmake where
it is missing). The build (about 30 s on 2 cores) is kept in pytest's cache folder, keyed
by the sources, the torch version and the compiler, so a rerun only runs it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.ufsemulator.export.test_export import JEDI_INPUTS, _load, aice_model, jedi_inputs
from ufsemulator.config import ExportConfig
from ufsemulator.export.torchscript import export_model

pytestmark = pytest.mark.cxx

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "cxx"
ROWS = 64


@pytest.fixture(scope="session")
def binary(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    cmake, compiler = shutil.which("cmake"), shutil.which("c++") or shutil.which("g++")
    if cmake is None or compiler is None:
        pytest.fail("the C++ example needs cmake and g++ (scripts/run-tests installs cmake)")
    import torch.utils

    key = hashlib.sha256()
    for path in (EXAMPLE / "CMakeLists.txt", *sorted(EXAMPLE.glob("*.cpp"))):
        key.update(path.name.encode() + path.read_bytes())
    key.update(f"{torch.__version__} {Path(compiler).resolve()}".encode())
    cache = request.config.cache
    base = cache.mkdir("cxx-example") if cache is not None else tmp_path_factory.mktemp("cxx")
    build = base / key.hexdigest()[:16]
    exe = build / "emulator_jacobian"
    if not exe.is_file():
        started = time.perf_counter()
        subprocess.run(
            [
                cmake,
                "-S",
                str(EXAMPLE),
                "-B",
                str(build),
                "-DCMAKE_BUILD_TYPE=Release",
                f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
            ],
            check=True,
            capture_output=True,
            text=True,
        )
        subprocess.run(
            [cmake, "--build", str(build), "-j", "2"], check=True, capture_output=True, text=True
        )
        print(f"built the C++ example in {time.perf_counter() - started:.1f} s")
    return exe


@pytest.fixture(scope="module")
def case(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A JEDI-named export and SABER-like inputs: K and kg/kg, a land row, a fractional mask."""
    tmp = tmp_path_factory.mktemp("cxx-case")
    options = ExportConfig(names="jedi", units="jedi")
    model_path = export_model(aice_model(), tmp / "model.pt", options)
    x = jedi_inputs(aice_model(), ROWS).float()
    x[5, :] = 1.0e30  # a land row holding CICE's finite fill value
    x[9, 2] = float("nan")
    mask = torch.ones(ROWS, 1)
    mask[[3, 7]] = 0.0
    mask[11] = 0.5
    x.numpy().astype("<f4").tofile(tmp / "inputs.f32")
    mask.numpy().astype("<f4").tofile(tmp / "mask.f32")
    return {"dir": tmp, "model": model_path, "x": x, "mask": mask}


@pytest.fixture(scope="module")
def cxx_run(binary: Path, case: dict[str, Any]) -> dict[str, Any]:
    tmp = case["dir"]
    out = subprocess.run(
        [
            str(binary),
            str(case["model"]),
            "--inputs",
            str(tmp / "inputs.f32"),
            "--mask",
            str(tmp / "mask.f32"),
            "--threads",
            "1",
            "--repeat",
            "5",
            "--jacobian-out",
            str(tmp / "jac.f32"),
            "--predict-out",
            str(tmp / "pred.f32"),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    report = json.loads(out.stdout)
    report["jac"] = torch.from_numpy(np.fromfile(tmp / "jac.f32", "<f4").reshape(ROWS, 1, 14))
    report["pred"] = torch.from_numpy(np.fromfile(tmp / "pred.f32", "<f4").reshape(ROWS, 1))
    return report


def test_cxx_reads_the_names_and_levels_saber_looks_up(cxx_run: dict[str, Any]) -> None:
    assert cxx_run["input_names"] == JEDI_INPUTS
    assert cxx_run["output_names"] == ["sea_ice_area_fraction"]
    assert cxx_run["input_levels"] == [0] * 14 and cxx_run["output_levels"] == [0]
    assert cxx_run["input_units"][:4] == ["K", "ppt", "K", "K"]
    assert cxx_run["jacobian_shape"] == [ROWS, 1, 14] and cxx_run["jacobian_dtype"] == "Float"
    assert cxx_run["threads"] == 1 and cxx_run["predict_ms"] > 0


@pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning")
def test_cxx_results_match_python(cxx_run: dict[str, Any], case: dict[str, Any]) -> None:
    loaded = _load(case["model"])
    jac = loaded.jac_physical(case["x"], case["mask"])
    torch.testing.assert_close(cxx_run["jac"], jac, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(cxx_run["pred"], loaded.predict(case["x"]), rtol=1e-5, atol=1e-6)
    assert (cxx_run["jac"][[3, 5, 7, 9]] == 0).all() and (cxx_run["pred"][[5, 9]] == 0).all()
    # Grad mode, then InferenceMode, then float64 inputs: the same Jacobian each time.
    assert cxx_run["inference_mode_max_diff"] == 0.0
    assert cxx_run["float64_dtype"] is True
    assert cxx_run["float64_max_diff"] <= 1e-5 * float(jac.abs().max())


@pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning")
def test_cxx_jacobian_matches_float64_finite_differences(
    cxx_run: dict[str, Any], case: dict[str, Any]
) -> None:
    loaded = _load(case["model"])
    model = aice_model()
    x = case["x"].double()
    fd = torch.zeros(ROWS, 1, 14, dtype=torch.float64)
    for k in range(14):
        h = 1e-5 * float(model.input_std[k]) * (1e-3 if k == 11 else 1.0)
        step = torch.zeros_like(x)
        step[:, k] = h
        fd[:, :, k] = (loaded.predict(x + step) - loaded.predict(x - step)) / (2 * h)
    fd *= case["mask"].double().reshape(-1, 1, 1)
    fd[[5, 9]] = 0.0  # no derivative where the inputs are not data
    assert (cxx_run["jac"].double() - fd).norm() <= 1e-4 * fd.norm()


def test_cxx_user_error_is_one_line_and_exit_2(binary: Path, tmp_path: Path) -> None:
    out = subprocess.run(
        [str(binary), str(tmp_path / "absent.pt")], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2 and out.stderr.startswith("error: ")
    assert out.stderr.count("\n") == 1 and "absent.pt" in out.stderr
