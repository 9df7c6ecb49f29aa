"""The C++ example (examples/cxx): built with CMake against the LibTorch inside the installed
torch wheel, it loads an export as SABER's TorchBalance does, through TorchScript and through
the AOTInductor package; its answers must be Python's.

Marked ``cxx``: it needs cmake and a C++17 compiler (scripts/run-tests installs cmake where
it is missing). The build (about 30 s on 2 cores) and the AOTInductor package (about 35 s)
are kept in pytest's cache folder, keyed by their sources, the torch version and the
compiler, so a rerun only runs them.

Tolerances: TorchScript in C++ equals Python's TorchScript to float32 rounding (rtol 1e-5).
The AOTInductor programs fuse and reorder float32 operations, so their Jacobian is within
1e-5 of the largest |J| entry of TorchScript's (measured: 4e-7 of it) and their
predictions within 1e-6 (absolute, aice in [0, 1]); fill rows are NaN and 0 in both.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.ufsemulator.export.test_export import JEDI_INPUTS, _load, aice_model, jedi_inputs
from ufsemulator.config import ExportConfig
from ufsemulator.export.aoti import package_export
from ufsemulator.export.torchscript import export_model

# One worker builds the example and the package (a cache folder two builds would write at once).
pytestmark = [pytest.mark.cxx, pytest.mark.xdist_group("cxx")]

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples" / "cxx"
ROWS = 64
LIBTORCH_VAR = "UFSEMU_LIBTORCH"
# What the AOTInductor package is made from: a change to any of these compiles it again.
AOTI_SOURCES = (
    "config.py",
    "export/names.py",
    "model/emulator.py",
    "export/torchscript.py",
    "export/aoti.py",
    "export/signature.py",
    "variables.py",
)


@pytest.fixture(scope="session")
def binary(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    cmake, compiler = shutil.which("cmake"), shutil.which("c++") or shutil.which("g++")
    if cmake is None or compiler is None:
        pytest.fail("the C++ example needs cmake and g++ (scripts/run-tests installs cmake)")
    import torch.utils

    # UFSEMU_LIBTORCH: another LibTorch to build and run the example against (a wheel's
    # torch/ folder, examples/cxx/README.md); the exports stay this torch's.
    other = os.environ.get(LIBTORCH_VAR)
    prefix = str(Path(other) / "share" / "cmake") if other else torch.utils.cmake_prefix_path
    key = hashlib.sha256()
    for path in (EXAMPLE / "CMakeLists.txt", *sorted(EXAMPLE.glob("*.cpp")), *EXAMPLE.glob("*.h")):
        key.update(path.name.encode() + path.read_bytes())
    key.update(f"{torch.__version__} {prefix} {Path(compiler).resolve()}".encode())
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
                f"-DCMAKE_PREFIX_PATH={prefix}",
            ],
            check=True,
            capture_output=True,
            text=True,
        )
        subprocess.run(
            [cmake, "--build", str(build), "-j", "2"], check=True, capture_output=True, text=True
        )
        print(f"built the C++ example in {time.perf_counter() - started:.1f} s")
    print(f"the C++ example links the LibTorch of {prefix}")
    return exe


@pytest.fixture(scope="session")
def case(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """A JEDI-named export (TorchScript and AOTInductor) and SABER-like inputs: K and kg/kg,
    a land row, a fractional mask."""
    tmp = tmp_path_factory.mktemp("cxx-case")
    options = ExportConfig(names="jedi")  # JEDI names: their units (K, kg/kg, SOCA's degC)
    model = aice_model()  # trained on 5 std either side of the mean: every test row inside
    model.set_input_range(
        model.input_mean - 5 * model.input_std, model.input_mean + 5 * model.input_std
    )
    model_path = export_model(model, tmp / "model.pt", options)
    key = hashlib.sha256(f"{torch.__version__} range 5 std".encode())
    for name in AOTI_SOURCES:
        key.update((REPO / "ufsemulator" / name).read_bytes())
    cache = request.config.cache
    base = cache.mkdir("aoti-package") if cache is not None else tmp
    package = base / f"{key.hexdigest()[:16]}.pt2"
    if not package.is_file():
        started = time.perf_counter()
        package_export(model_path, package)
        print(f"compiled the AOTInductor package in {time.perf_counter() - started:.1f} s")
    x = jedi_inputs(aice_model(), ROWS).float()
    x[5, :] = 1.0e30  # a land row holding CICE's finite fill value
    x[9, 2] = float("nan")
    mask = torch.ones(ROWS, 1)
    mask[[3, 7]] = 0.0
    mask[11] = 0.5
    x.numpy().astype("<f4").tofile(tmp / "inputs.f32")
    mask.numpy().astype("<f4").tofile(tmp / "mask.f32")
    return {"dir": tmp, "model": model_path, "aoti": package, "x": x, "mask": mask}


@pytest.fixture(scope="module")
def cxx_run(binary: Path, case: dict[str, Any]) -> dict[str, Any]:
    tmp = case["dir"]
    out = subprocess.run(
        [
            str(binary),
            str(case["model"]),
            "--aoti",
            str(case["aoti"]),
            "--aoti-jacobian-out",
            str(tmp / "aoti_jac.f32"),
            "--aoti-predict-out",
            str(tmp / "aoti_pred.f32"),
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
    aoti_jac = np.fromfile(tmp / "aoti_jac.f32", "<f4").reshape(ROWS, 1, 14)
    report["aoti_jac"] = torch.from_numpy(aoti_jac)
    report["aoti_pred"] = torch.from_numpy(np.fromfile(tmp / "aoti_pred.f32", "<f4"))
    return report


def test_cxx_reads_the_names_and_levels_saber_looks_up(cxx_run: dict[str, Any]) -> None:
    assert cxx_run["input_names"] == JEDI_INPUTS
    assert cxx_run["output_names"] == ["sea_ice_area_fraction"]
    assert cxx_run["input_levels"] == [0] * 14 and cxx_run["output_levels"] == [0]
    assert cxx_run["input_units"][:4] == ["degC", "ppt", "K", "degC"]
    assert cxx_run["jacobian_shape"] == [ROWS, 1, 14] and cxx_run["jacobian_dtype"] == "Float"
    assert cxx_run["threads"] == 1 and cxx_run["predict_ms"] > 0


@pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning")
def test_cxx_results_match_python(cxx_run: dict[str, Any], case: dict[str, Any]) -> None:
    loaded = _load(case["model"])
    jac = loaded.jac_physical(case["x"], case["mask"])
    torch.testing.assert_close(cxx_run["jac"], jac, rtol=1e-5, atol=1e-7)
    expected = loaded.predict(case["x"])
    torch.testing.assert_close(cxx_run["pred"], expected, rtol=1e-5, atol=1e-6, equal_nan=True)
    assert (cxx_run["jac"][[3, 5, 7, 9]] == 0).all() and cxx_run["pred"][[5, 9]].isnan().all()
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


@pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning")
def test_cxx_aoti_package_matches_python(cxx_run: dict[str, Any], case: dict[str, Any]) -> None:
    loaded = _load(case["model"])
    jac = loaded.jac_physical(case["x"], case["mask"])
    aoti = cxx_run["aoti"]
    assert aoti["metadata_has_signature"] is True and aoti["predict_outputs"] == 2
    assert aoti["flagged_rows"] == 2  # the land row and the NaN row: missing
    assert float((cxx_run["aoti_jac"] - jac).abs().max()) <= 1e-5 * float(jac.abs().max())
    assert (cxx_run["aoti_jac"][[3, 5, 7, 9]] == 0).all()
    pred, expected = cxx_run["aoti_pred"].reshape(ROWS, 1), loaded.predict(case["x"])
    torch.testing.assert_close(pred, expected, rtol=0, atol=1e-6, equal_nan=True)
    assert pred[[5, 9]].isnan().all() and aoti["first_jacobian_ms"] > 0


def test_python_loads_the_aoti_package_with_the_exports_signature(case: dict[str, Any]) -> None:
    from ufsemulator.export.aoti import load
    from ufsemulator.export.torchscript import read_extra_files

    jac = load(case["aoti"], "jac_physical")
    _, flags = load(case["aoti"], "predict")(case["x"])
    assert (
        jac.loader.get_metadata()["signature.json"]
        == read_extra_files(case["model"])["signature.json"]
    )
    assert flags.dtype == torch.int8 and flags[[5, 9]].tolist() == [2, 2]
    assert tuple(jac(case["x"][:1], case["mask"][:1]).shape) == (1, 1, 14)  # any N, even 1


def test_cxx_refuses_a_background_in_other_units(binary: Path, tmp_path: Path) -> None:
    """The documented path: the caller passes its background's units; a mismatch is exit 2."""
    model = export_model(aice_model(), tmp_path / "jedi.pt", ExportConfig(names="jedi"))
    kelvin = "K,ppt,degC,degC,m,m,ppt,m/s,m/s,m/s,m/s,g/kg,W/m2,W/m2"
    out = subprocess.run(
        [str(binary), str(model), "--input-units", kelvin, "--rows", "4"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and out.stdout == ""
    assert "sea_water_potential_temperature in K (the module takes degC)" in out.stderr
    assert "air_temperature in degC (the module takes K)" in out.stderr
    assert "water_vapor_mixing_ratio_wrt_moist_air in g/kg (the module takes kg/kg)" in out.stderr
    celsius = "degC,ppt,K,degC,m,m,ppt,m/s,m/s,m/s,m/s,kg/kg,W/m2,W/m2"
    ok = subprocess.run(
        [str(binary), str(model), "--input-units", celsius, "--rows", "4", "--repeat", "1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ok.returncode == 0 and json.loads(ok.stdout)["input_units"][0] == "degC"


def test_cxx_stops_on_a_background_in_other_units_with_the_counts(
    binary: Path, case: dict[str, Any], tmp_path: Path
) -> None:
    """SABER passes no units: a background with air temperature in degC where the name
    carries K lands out of range in every row, and jac_physical refuses it with the counts
    (exit 2, one line), instead of a zero Jacobian and exit 0. In range: exit 0."""
    wrong = case["x"].clone()
    wrong[:, 2] -= 273.15
    wrong.numpy().astype("<f4").tofile(tmp_path / "celsius.f32")
    out = subprocess.run(
        [str(binary), str(case["model"]), "--inputs", str(tmp_path / "celsius.f32"),
         "--repeat", "1"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2 and out.stdout == "" and out.stderr.count("\n") == 1
    # 64 rows: one land row and one NaN row are missing, the other 62 all out of range.
    assert out.stderr.startswith("error: jac_physical refused: 62 of 62 rows with data")
    assert "air_temperature (K) 62" in out.stderr and "max_out_of_range 0.01" in out.stderr
    ok = subprocess.run(
        [str(binary), str(case["model"]), "--inputs", str(case["dir"] / "inputs.f32"),
         "--repeat", "1"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr


def test_the_package_refuses_a_background_in_other_units(case: dict[str, Any]) -> None:
    """The same refusal from the .pt2, straight through torch's loader, in every program
    that linearises; predict still answers (with its row flags)."""
    from torch._inductor.package import load_package

    wrong = case["x"].clone()
    wrong[:, 2] -= 273.15
    n = wrong.shape[0]
    calls = {
        "jac_physical": (wrong, torch.ones(n, 1)),
        "tlm": (wrong, torch.ones(n, 14), torch.ones(n, 1)),
        "adjoint": (wrong, torch.ones(n, 1), torch.ones(n, 1)),
    }
    for name, args in calls.items():
        with pytest.raises(RuntimeError, match=rf"{name} refused: more than 0.01 of the rows"):
            load_package(str(case["aoti"]), name)(*args)
        assert load_package(str(case["aoti"]), name)(case["x"], *args[1:]) is not None
    _, flags = load_package(str(case["aoti"]), "predict")(wrong)
    assert (flags == 1).sum() == n - 2


# Every program, every argument with 0 rows or a different count than ``inputs``.
MISMATCHED = {
    "predict": [],
    "jac_physical": [(8, 0), (0, 8), (8, 9)],
    "tlm": [(8, 0, 8), (8, 8, 0), (0, 8, 8), (8, 8, 3)],
    "adjoint": [(8, 0, 8), (8, 8, 0), (0, 8, 8), (8, 3, 8)],
}


@pytest.mark.parametrize("program", ["jac_physical", "tlm", "adjoint"])
def test_the_package_refuses_rows_that_do_not_match_without_a_crash(
    case: dict[str, Any], program: str
) -> None:
    """torch checks each argument alone; a 0-row mask beside 8-row inputs read past it
    (a segfault). Run in a child process, so a crash fails the test instead of ending it."""
    script = (
        "import sys, torch\n"
        "from torch._inductor.package import load_package\n"
        "from ufsemulator.export.aoti import arguments\n"
        f"run = load_package({str(case['aoti'])!r}, {program!r})\n"
        f"args = arguments({program!r}, 14, 1)\n"
        f"for rows in {MISMATCHED[program]!r}:\n"
        "    tensors = [torch.ones(r, a.columns) for r, a in zip(rows, args)]\n"
        "    try:\n"
        "        run(*tensors)\n"
        "        print('served', rows)\n"
        "    except RuntimeError as exc:\n"
        "        print('refused', rows, str(exc).strip().splitlines()[0])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert len(lines) == len(MISMATCHED[program]) and all(
        line.startswith("refused") for line in lines
    ), lines
    assert "rows, but input_handles[0] has 8" in lines[0]


def test_describe_reads_the_aoti_package_too(
    case: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    from ufsemulator.__main__ import main

    assert main(["export", "--describe", str(case["aoti"])]) == 0
    out = capsys.readouterr().out
    assert "(format 2)" in out and re.search(r"sea_water_potential_temperature +degC +level 0", out)
    assert "compiled for: portable, vector ISA avx2, -march=x86-64-v3 on " in out
    assert "runs on any x86-64 CPU with AVX2 and FMA" in out


# The bad inputs and small batches of the C++ example's --aoti-probe, as Python makes them.
PROBES = {
    "float64": lambda x, m: (x.double(), m),
    "13 columns": lambda x, m: (x[:, :13].contiguous(), m),
    "transposed": lambda x, m: (x.t().contiguous().t(), m),
    "short mask": lambda x, m: (x, m[:5]),
    "mask 0 rows": lambda x, m: (x, m[:0]),
    "inputs 0 rows": lambda x, m: (x[:0], m),
    "rows 0": lambda x, m: (x[:0], m[:0]),
    "rows 1": lambda x, m: (x[:1], m[:1]),
    "rows 7": lambda x, m: (x[:7], m[:7]),
}
REFUSED = ("float64", "13 columns", "short mask", "mask 0 rows", "inputs 0 rows")
EXPECTED = {name: "refused" for name in REFUSED}


def _outcome(call: Any) -> str:
    try:
        call()
    except (ValueError, RuntimeError):
        return "refused"
    return "ok"


def test_the_package_refuses_bad_inputs_itself_and_both_loaders_agree(
    binary: Path, case: dict[str, Any]
) -> None:
    """Each bad input is refused by the package itself (a caller that calls the loader
    directly, as SABER would) and by the checked calls of C++ and Python, which copy a
    transposed view instead; 0, 1 and 7 rows are served."""
    from torch._inductor.package import load_package

    from ufsemulator.export.aoti import load

    out = subprocess.run(
        [str(binary), str(case["model"]), "--aoti", str(case["aoti"]), "--rows", "16",
         "--repeat", "1", "--aoti-probe"],
        check=True, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    cxx = json.loads(out.stdout)["probe"]
    checked, raw = (
        load(case["aoti"], "jac_physical"),
        load_package(str(case["aoti"]), "jac_physical"),
    )
    x, m = case["x"][:8], case["mask"][:8]
    python = {
        name: {
            "checked": _outcome(lambda f=make: checked(*f(x, m))),
            "raw": _outcome(lambda f=make: raw(*f(x, m))),
        }
        for name, make in PROBES.items()
    }
    assert python == cxx
    for name, outcome in cxx.items():
        assert outcome["raw"] == EXPECTED.get(name, "refused" if name == "transposed" else "ok")
        assert outcome["checked"] == EXPECTED.get(name, "ok")


# The largest batch is the full tier's (docs/testing.md).
@pytest.mark.parametrize("rows", [0, 1, 7, 10_000, pytest.param(100_000, marks=pytest.mark.full)])
def test_python_loader_serves_any_number_of_rows(case: dict[str, Any], rows: int) -> None:
    from ufsemulator.export.aoti import load

    x = case["x"].repeat(100_000 // ROWS + 1, 1)[:rows]
    mask, dx, dy = torch.ones(rows, 1), torch.ones(rows, 14), torch.ones(rows, 1)
    prediction, flags = load(case["aoti"], "predict")(x)
    assert prediction.shape == (rows, 1) and flags.shape == (rows,)
    assert load(case["aoti"], "jac_physical")(x, mask).shape == (rows, 1, 14)
    assert load(case["aoti"], "tlm")(x, dx, mask).shape == (rows, 1)
    assert load(case["aoti"], "adjoint")(x, dy, mask).shape == (rows, 14)


# A batch of 10,000 rows in the default tier, of 100,000 in the full one (docs/testing.md).
BATCHES = [10_000, pytest.param(100_000, marks=pytest.mark.full)]


@pytest.mark.parametrize("rows", BATCHES)
@pytest.mark.parametrize("threads", ["1", "2"])
def test_cxx_rows_have_the_same_bits_alone_and_in_a_batch(
    binary: Path, case: dict[str, Any], threads: str, rows: int
) -> None:
    """TorchScript and the package, in C++: rows 0, 1, N/2 and N-1 alone against the batch."""
    out = subprocess.run(
        [str(binary), str(case["model"]), "--aoti", str(case["aoti"]), "--rows", str(rows),
         "--threads", threads, "--repeat", "1", "--invariance"],
        check=True, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    invariance = json.loads(out.stdout)["invariance"]
    assert len(invariance) == 8 and set(invariance.values()) == {0}, invariance


@pytest.mark.parametrize("rows", BATCHES)
def test_python_aoti_rows_have_the_same_bits_alone_and_in_a_batch(
    case: dict[str, Any], rows: int
) -> None:
    from bench.batch_invariance import run

    module = _load(case["model"])
    results = run(module, case["aoti"], rows, [1, 2], repeat=1)
    aoti = [r for r in results if r["path"] in ("aoti", "torchscript")]
    assert len(aoti) == 16
    assert all(r["differing_rows"] == 0 and not r["differs_from_first_threads"] for r in aoti)


@pytest.mark.parametrize("cuda", [True, False])
def test_cmake_links_a_cuda_wheel_directly(tmp_path: Path, cuda: bool) -> None:
    """A CUDA wheel's TorchConfig.cmake stops without a matching CUDA toolkit (as this
    stand-in's does): for a wheel with libtorch_cuda.so the example's CMake links
    libtorch_cpu and libc10 directly; a CPU wheel goes through TorchConfig.cmake.
    Configure only (no compiler run)."""
    cmake = shutil.which("cmake")
    if cmake is None:
        pytest.fail("the C++ example needs cmake (scripts/run-tests installs cmake)")
    torch_dir = tmp_path / "torch"
    (torch_dir / "share" / "cmake" / "Torch").mkdir(parents=True)
    (torch_dir / "share" / "cmake" / "Torch" / "TorchConfig.cmake").write_text(
        'message(FATAL_ERROR "stand-in TorchConfig: wants a CUDA toolkit")\n'
    )
    (torch_dir / "lib").mkdir()
    libs = ["libtorch_cpu.so", "libc10.so"] + (["libtorch_cuda.so"] if cuda else [])
    for lib in libs:
        (torch_dir / "lib" / lib).write_bytes(b"")
    out = subprocess.run(
        [cmake, "-S", str(EXAMPLE), "-B", str(tmp_path / "build"),
         f"-DCMAKE_PREFIX_PATH={torch_dir / 'share' / 'cmake'}"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    linked = f"LibTorch: linking {torch_dir / 'lib' / 'libtorch_cpu.so'} and libc10.so directly"
    if cuda:
        assert out.returncode == 0, out.stderr
        assert linked in out.stdout
    else:
        assert out.returncode != 0 and "stand-in TorchConfig" in out.stderr
