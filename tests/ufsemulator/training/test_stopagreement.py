"""The ranks' stop agreement between epoch ends: a request one rank makes is answered to
every rank at the same check, the one after the request reached the vote."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
# Each rank runs 6 checks; rank ``asker`` is asked to stop from check ``at`` on.
RANK = """\
import json, sys
from datetime import timedelta
import torch.distributed as dist
from ufsemulator.training.loop import StopAgreement
rank, world, store_file, asker, at = sys.argv[1:6]
rank, world, asker, at = int(rank), int(world), int(asker), int(at)
store = dist.FileStore(store_file, world)
dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                        timeout=timedelta(seconds=60))
agreement = StopAgreement(None)
answers = [agreement.check(rank == asker and check >= at) for check in range(6)]
after = agreement.settle()
dist.destroy_process_group()
print(json.dumps({"answers": answers, "settled": after}))
"""


def _run(tmp_path: Path, world: int, asker: int, at: int) -> list[dict[str, object]]:
    store = tmp_path / "store"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RANK, str(r), str(world), str(store), str(asker), str(at)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(world)
    ]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def test_a_request_is_answered_to_every_rank_at_the_next_check(tmp_path: Path) -> None:
    results = _run(tmp_path, world=3, asker=2, at=2)
    # The vote started at check 2 holds rank 2's request; check 3 answers it, to all.
    for result in results:
        assert result["answers"][:4] == [False, False, False, True], results
    # After the answer, each check's vote is the previous check's, and still says stop.
    assert all(result["answers"][4:] == [False, True] for result in results), results
    assert all(result["settled"] is False for result in results), results


def test_without_a_request_nobody_stops(tmp_path: Path) -> None:
    results = _run(tmp_path, world=2, asker=0, at=99)
    assert all(result["answers"] == [False] * 6 for result in results), results
    assert all(result["settled"] is False for result in results), results
