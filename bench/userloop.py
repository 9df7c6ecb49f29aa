"""The loop a user writes instead: xarray over the daily files, every rank loading all of
them, ``DataLoader`` + ``DistributedSampler`` + plain DDP, to a target validation loss.

    torchrun --standalone --nproc-per-node 4 -m bench.userloop --data 'DIR/iceh.*.nc' \\
        --target 0.01 --run-dir RUN

Same model (EmulatorMLP 14-64-64-64-1, seed 42), batch (1000 per rank), Adam (lr 1e-4 x
ranks, weight decay 1e-4), mask (sea-ice points) and validation share (20%) as
``python -m ufsemulator train``; the validation loss (normalised MSE over the whole
validation set, on every rank) after each epoch decides the stop. Rank 0 saves
``model.pt`` (the state dict, as such a script would) and ``result.json``.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import time
from pathlib import Path

CICE = {  # our input name -> daily-stream variable
    "sst": "sst_d",
    "sss": "sss_d",
    "tair": "Tair_d",
    "tsfc": "Tsfc_d",
    "hi": "hi_d",
    "hs": "hs_d",
    "sice": "sice_d",
    "uocn": "uocn_d",
    "vocn": "vocn_d",
    "uatm": "uatm_d",
    "vatm": "vatm_d",
    "qref": "Qref_d",
    "flwdn": "flwdn_d",
    "fswdn": "fswdn_d",
}


def main(argv: list[str] | None = None) -> int:
    started = time.time()
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", required=True, help="glob of the daily files")
    parser.add_argument("--target", type=float, required=True)
    parser.add_argument("--max-epochs", type=int, default=50)
    parser.add_argument("--max-seconds", type=float, default=1e9, help="give up after this")
    parser.add_argument("--run-dir", type=Path, required=True)
    args = parser.parse_args(argv)

    import numpy as np
    import torch
    import torch.distributed as dist
    import xarray as xr
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler

    from ufsemulator.model.emulator import EmulatorMLP, ModelConfig
    from ufsemulator.variables import INPUT_NAMES

    local = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    load_started = time.time()
    files = sorted(glob.glob(args.data))
    ds = xr.concat(
        [xr.open_dataset(f) for f in files],
        dim="time",
        data_vars="minimal",  # the grid (tmask, TLAT, ...) once, not once per day
        coords="minimal",
        compat="override",
    )
    aice = ds["aice_d"].values
    ocean = np.broadcast_to(ds["tmask"].values > 0.5, aice.shape)
    columns = [ds[CICE[name]].values for name in INPUT_NAMES]
    valid = ocean & np.isfinite(aice) & (aice > 0)
    for column in columns:
        valid &= np.isfinite(column)
    x_all = np.stack([c[valid] for c in columns], axis=1).astype(np.float32)
    y_all = aice[valid].astype(np.float32)[:, None]
    load_s = time.time() - load_started

    n = x_all.shape[0]
    n_val = round(0.2 * n)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(42)).numpy()
    val, train = order[:n_val], order[n_val:]
    x_mean, x_std = x_all[train].mean(0), x_all[train].std(0)
    y_mean, y_std = y_all[train].mean(0), y_all[train].std(0)
    x_std[x_std <= 1e-6], y_std[y_std <= 1e-6] = 1.0, 1.0
    x_train = torch.from_numpy((x_all[train] - x_mean) / x_std)
    y_train = torch.from_numpy((y_all[train] - y_mean) / y_std)
    x_val = torch.from_numpy((x_all[val] - x_mean) / x_std).to(device)
    y_val = torch.from_numpy((y_all[val] - y_mean) / y_std).to(device)

    torch.manual_seed(42)
    config = ModelConfig(
        n_in=len(INPUT_NAMES),
        input_names=INPUT_NAMES,
        input_levels=(0,) * len(INPUT_NAMES),
        hidden=(64, 64, 64),
        activation="gelu",
        output_names=("aice",),
    )
    model = DDP(
        EmulatorMLP(config).to(device), device_ids=[device] if device.type == "cuda" else None
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4 * world, weight_decay=1e-4)
    sampler: DistributedSampler[tuple[torch.Tensor, ...]] = DistributedSampler(
        TensorDataset(x_train, y_train), shuffle=True, seed=42
    )
    loader = DataLoader(
        TensorDataset(x_train, y_train),
        batch_size=1000,
        sampler=sampler,
        pin_memory=device.type == "cuda",
    )
    first_step = time.time()
    history: list[float] = []
    reached = False
    for epoch in range(args.max_epochs):
        sampler.set_epoch(epoch)
        model.train()
        running = 0.0
        for xb, yb in loader:
            xb, yb = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            running += loss.item()
        model.eval()
        with torch.no_grad():
            total = sum(
                torch.nn.functional.mse_loss(model.module(xc), yc, reduction="sum").item()
                for xc, yc in zip(x_val.split(65536), y_val.split(65536), strict=True)
            )
        history.append(total / y_val.numel())
        if rank == 0:
            print(f"epoch {epoch + 1}: train {running / len(loader):.5g}, val {history[-1]:.5g}")
        reached = history[-1] <= args.target
        if reached or time.time() - started > args.max_seconds:
            break
    if rank == 0:
        args.run_dir.mkdir(parents=True, exist_ok=True)
        torch.save(model.module.state_dict(), args.run_dir / "model.pt")
        result = {
            "rows": n,
            "load_s": load_s,
            "startup_s": first_step - started,
            "train_s": time.time() - first_step,
            "epochs": len(history),
            "val_loss": history,
            "reached": reached,
            "world_size": world,
        }
        (args.run_dir / "result.json").write_text(json.dumps(result, indent=2))
        print(f"load {load_s:.1f} s, {n} rows, {len(history)} epochs, reached {reached}")
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
