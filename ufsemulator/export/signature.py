"""What an exported model takes and gives: one record, in the file and in words.

Like MLflow's model signature, the export stores, for every input and output, its name,
unit and level, and for the inputs their training range, as ``signature.json`` in
``model.pt`` (and in ``model.pt2``'s metadata). ``describe`` prints it with the
provenance for ``python -m ufsemulator export --describe``; ``model_card`` writes the
short card kept beside the model.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

# Where the JEDI names come from (docs/data.md says which of them were checked).
JEDI_REFERENCE = (
    "ocean names and sea_ice_area_fraction: SOCA GetValues names (JCSDA-internal/soca "
    "test/Data/fields_metadata.yml, commit 0b255b4); the others: CF standard names; "
    "units: each name's own (ufsemulator.export.names): SOCA's degC for the ocean "
    "temperature, K and kg/kg as a JEDI atmospheric background holds them"
)


def of(model: Any) -> dict[str, Any]:
    """The signature of an :class:`EmulatorMLP` prepared for export (or its script)."""
    low = [float(v) for v in model.input_min.tolist()]
    high = [float(v) for v in model.input_max.tolist()]
    return {
        "inputs": [
            {"name": n, "unit": u, "level": int(lv), "train_min": lo, "train_max": hi}
            for n, u, lv, lo, hi in zip(
                model.input_names, model.input_units, model.input_levels, low, high, strict=True
            )
        ],
        "outputs": [
            {"name": n, "unit": u, "level": int(lv), "lower": lo, "upper": hi}
            for n, u, lv, lo, hi in zip(
                model.output_names,
                model.output_units,
                model.output_levels,
                model.output_lower,
                model.output_upper,
                strict=True,
            )
        ],
        "dtype": "float32 or float64 (answers in the inputs' dtype)",
        "fill_threshold": float(model.fill_threshold),
        "fill_value": float(model.fill_value),
        "land_value": float(model.land_value) if math.isfinite(model.land_value) else None,
        "land_inputs": [model.input_names[k] for k in model.land_columns]
        if math.isfinite(model.land_value)
        else [],
        "range_margin": float(model.range_margin),
        "out_of_range": "fill" if model.fill_out_of_range else "flag",
        "max_out_of_range": float(model.max_out_of_range),
        "clamp": bool(model.clamp_output),
        "activation": str(model.activation),
        "methods": {
            "predict": "[N, n_in] physical -> [N, n_out] physical",
            "row_flags": "[N, n_in] -> [N] int8: 0 in range, 1 out of range, 2 missing or land",
            "jac_physical": "([N, n_in], mask [N] or [N, 1]) -> [N, n_out, n_in]",
            "tlm": "([N, n_in], dx [N, n_in]) -> [N, n_out]",
            "adjoint": "([N, n_in], dy [N, n_out]) -> [N, n_in]",
            "check_background": "([N, n_in], mask) -> {input name: rows out of range, ...}",
            "forward": "NORMALISED in and out (training); not the prediction",
        },
        "jedi_names_follow": JEDI_REFERENCE,
    }


def _refusal_text(sig: Mapping[str, Any]) -> str:
    share = float(sig.get("max_out_of_range", 1.0))
    if share >= 1.0:
        return "too many rows out of range: never refused (max_out_of_range 1)"
    return (
        f"too many rows out of range: jac_physical, tlm and adjoint refuse (an error with the "
        f"counts per input) when more than {share:.4g} of the rows with data are out of range"
    )


def _land_text(sig: Mapping[str, Any]) -> str:
    value = sig.get("land_value")
    if value is None:
        return "no land value (land rows must hold a fill value or NaN)"
    inputs = ", ".join(sig.get("land_inputs", []))
    return f"a row whose {inputs} all hold {_number(value)} is missing"


def _number(value: Any) -> str:
    if isinstance(value, str):
        return value
    value = float(value)
    return str(value) if not math.isfinite(value) else f"{value:.6g}"


def describe(extra: Mapping[str, str], path: str) -> str:
    """The ``--describe`` text of an export's extra files (format 1 files have none)."""
    if not extra.get("signature.json"):
        return (
            f"{path}: an export without a signature (format 1, before names, units and "
            "ranges were stored in the file); export it again"
        )
    sig = json.loads(extra["signature.json"])
    origin = json.loads(extra["provenance.json"]) if extra.get("provenance.json") else {}
    lines = [f"{path} (format {extra.get('format_version') or '?'})", "inputs:"]
    width = max(len(item["name"]) for item in sig["inputs"] + sig["outputs"])
    for item in sig["inputs"]:
        low, high = (_number(item[key]) for key in ("train_min", "train_max"))
        known = "inf" not in low + high
        lines.append(
            f"  {item['name']:<{width}}  {item['unit'] or '-':<6} level {item['level']}  "
            + (f"trained on {low} .. {high}" if known else "training range not recorded")
        )
    lines.append("outputs:")
    for item in sig["outputs"]:
        lines.append(
            f"  {item['name']:<{width}}  {item['unit'] or '-':<6} level {item['level']}  "
            f"bounds {_number(item['lower'])} .. {_number(item['upper'])}"
            + (" (clamped)" if sig["clamp"] else "")
        )
    lines += [
        f"missing rows (NaN, inf, |x| >= {_number(sig['fill_threshold'])}): predict gives "
        f"{_number(sig['fill_value'])}, jac_physical, tlm and adjoint 0",
        "land: " + _land_text(sig),
        f"out of range (beyond the training range by {_number(sig['range_margin'])} of it): "
        + ("predict gives the fill value" if sig["out_of_range"] == "fill" else "flagged")
        + " (row_flags), jac_physical, tlm and adjoint 0",
        _refusal_text(sig),
        "forward: NORMALISED in and out (training), not the prediction: call predict",
    ]
    if extra.get("cpu_isa"):  # an AOTInductor package: compiled code for one kind of CPU
        target = extra.get("cpu_target") or "host"  # a package from before the choice
        runs_on = (
            "any x86-64 CPU with AVX2 and FMA (Haswell and later)"
            if target == "portable"
            else "CPUs with every extension of the compiling machine"
        )
        lines.append(
            f"compiled for: {target}, vector ISA {extra['cpu_isa']}, "
            f"-march={extra.get('cpu_march')} on {extra.get('compiled_on_cpu')}: runs on "
            f"{runs_on}; another stops on an illegal instruction"
        )
    return "\n".join(lines + provenance_lines(origin))


def provenance_lines(origin: Mapping[str, Any]) -> list[str]:
    """Where the export came from: code, torch, checkpoint, each data file's SHA-256 as
    ``sha256sum`` prints it (so ``sha256sum -c`` can check them), metrics, config."""
    data = origin.get("training_data") or {}
    metrics = origin.get("metrics") or {}
    lines = [
        "provenance:",
        f"  package {origin.get('package_version')} commit {origin.get('git_commit')}, "
        f"torch {origin.get('torch_version')}",
        f"  checkpoint {origin.get('checkpoint')}",
    ]
    if data:
        lines.append(
            f"  records {data.get('first_record_time')} .. {data.get('last_record_time')} "
            f"(time {data.get('time_selection')}); the files, as sha256sum prints them:"
        )
        for key_paths, key_digests in (
            ("paths", "files_sha256"),
            ("atmosphere_paths", "atmosphere_files_sha256"),
        ):
            pairs = zip(data.get(key_digests) or [], data.get(key_paths) or [], strict=False)
            lines += [f"    {digest}  {path}" for digest, path in pairs]
    else:
        lines.append("  data not recorded (an export of a bare model or a lone checkpoint)")
    lines.append(
        "  metrics "
        + (", ".join(f"{k} {_number(v)}" for k, v in metrics.items() if v is not None) or "none")
    )
    config = origin.get("config") or {}
    lines.append("  config" + ("" if config else " not recorded"))
    for section, values in config.items():
        shown = values
        if isinstance(values, Mapping):
            shown = ", ".join(f"{k} {json.dumps(v)}" for k, v in values.items())
        lines.append(f"    {section}: {shown}")
    return lines


def model_card(name: str, sig: Mapping[str, Any], origin: Mapping[str, Any]) -> str:
    """A short Markdown card: what the model is for, takes, gives, and came from."""
    extra = {"signature.json": json.dumps(sig), "provenance.json": json.dumps(origin)}
    extra["format_version"] = str(origin.get("format_version", ""))
    return (
        f"# Model card: {name}\n\n"
        "A per-point MLP emulator of sea-ice model fields (ufsemulator, in hpcdist), "
        "exported for a data-assimilation system (JCSDA SABER's TorchBalance calls "
        "`jac_physical`). Intended use: the balance operator's Jacobian and predictions "
        "inside the training range below; not a forecast model. Rows flagged by "
        "`row_flags` are outside what it was trained on.\n\n"
        "```\n" + describe(extra, name) + "\n```\n\n" + _card_notes(origin)
    )


def _card_notes(origin: Mapping[str, Any]) -> str:
    """How the card's R^2 was measured, and what the AOTInductor package holds."""
    training = (origin.get("config") or {}).get("training") or {}
    share = training.get("val_fraction", 0.2)
    return (
        "**R^2** (`best_val_r2`, `final_val_r2` above) is 1 - SSE/SST over the validation "
        f"rows: a seeded random {share:g} of the training data's rows "
        "(`training.val_fraction`), the same on every rank, summed over all ranks. It is "
        "the network's own output, before any clamp or fill, on rows of the same files "
        "and times as training: not a held-out period or region.\n\n"
        "**model.pt2** (with `export --aoti` or `export.aoti: true`) holds the same weights "
        "and the same signature and provenance, compiled ahead of time by AOTInductor into "
        "four float32 programs: `predict` (prediction and row flags), `jac_physical`, "
        "`tlm`, `adjoint`. It is compiled for `x86-64-v3` (AVX2 and FMA, any x86-64 CPU "
        "since Haswell) unless `--aoti-cpu host` chose the compiling machine's every "
        "extension; `export --describe model.pt2` says which. It refuses what the "
        "TorchScript methods refuse, and inputs of another dtype, shape or row count.\n"
    )


def check_units(sig: Mapping[str, Any], given: Mapping[str, str]) -> None:
    """Refuse a background whose units (``given``: exported name -> unit, as the caller
    knows them) differ from those the model takes; every input must be given. Spellings
    are compared as :func:`canonical_unit` reads them ("K" == "kelvin")."""
    from ufsemulator.variables import canonical_unit

    wrong = []
    for item in sig["inputs"]:
        name, unit = item["name"], item["unit"]
        if name not in given:
            wrong.append(f"{name} (no unit given; the model takes {unit or 'no unit'})")
            continue
        have = canonical_unit(given[name]) or given[name]
        if have != (canonical_unit(unit) or unit):
            wrong.append(f"{name} in {given[name]} (the model takes {unit or 'no unit'})")
    if wrong:
        raise ValueError(f"background units do not match the model: {'; '.join(wrong)}")
