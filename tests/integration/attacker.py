"""A second, unprivileged user's actions against the victim (root), for the attack tests.

Started by the test as root, this imports torch first (its files sit below /root, which the
unprivileged user cannot read), then becomes the attacker (``ATTACKER_UID``/``GID``, no
supplementary groups) and only then acts: everything it touches, it touches with the
attacker's rights alone.

    python3 -m tests.integration.attacker ACTION ARGS...

Exit 0: the action succeeded; 13: refused by the system (permission denied); other:
the action failed otherwise. One line on stdout says what happened.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

_DENIED = 13


def _become_attacker() -> None:
    uid, gid = int(os.environ["ATTACKER_UID"]), int(os.environ["ATTACKER_GID"])
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    os.umask(0o000)  # a careless (or hostile) user: everything it makes, anyone can write


def _mkdir(path: str) -> None:
    os.makedirs(path, exist_ok=True)
    os.chmod(path, 0o777)


def _write(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)


def _overwrite(path: str, source: str) -> None:
    """Replace a file's contents in place (its folder need not be writable)."""
    with open(source, "rb") as handle:
        data = handle.read()
    with open(path, "r+b") as handle:
        handle.truncate(0)
        handle.write(data)


def _copy(source: str, path: str) -> None:
    """A new file of the attacker's with another's readable bytes (a model she copies)."""
    with open(source, "rb") as handle:
        data = handle.read()
    with open(path, "wb") as handle:
        handle.write(data)


def _read(path: str) -> None:
    with open(path, "rb") as handle:
        handle.read()


def _symlink(target: str, link: str) -> None:
    os.symlink(target, link)


def _rename(source: str, target: str) -> None:
    """``mv source target`` in a folder she can write: a name of the victim's moved."""
    os.rename(source, target)


def _remove(path: str) -> None:
    os.unlink(path)


def _exchange(first: str, second: str) -> None:
    """Swap two names atomically (``renameat2(RENAME_EXCHANGE)``), as in the attacks on a
    folder's name between a check and a read."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    at_fdcwd, rename_exchange = -100, 2
    if libc.renameat2(at_fdcwd, first.encode(), at_fdcwd, second.encode(), rename_exchange):
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno), first)


def _listen(*ports: str) -> None:
    """Squat the given ports on every interface until killed."""
    sockets = []
    for port in ports:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("0.0.0.0", int(port)))
        sock.listen(16)
        sockets.append(sock)
    print(f"listening on {', '.join(ports)}", flush=True)
    time.sleep(600)


def _join(port: str) -> None:
    """Join the victim's rendezvous as rank 1 of 2 and behave like an hpcdist rank that
    does not know the secret: nonces, then a made-up proof, then wait for the weights."""
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=1,
        world_size=2,
        timeout=timedelta(seconds=20),
    )
    print("attacker joined the process group as rank 1", flush=True)
    for size in (16, 32):
        mine = torch.randint(0, 256, (size,), dtype=torch.uint8)
        parts = [torch.empty_like(mine) for _ in range(2)]
        dist.all_gather(parts, mine)
    weights = torch.zeros(3)
    dist.all_reduce(weights)
    print(f"attacker received {weights.tolist()}", flush=True)


def _sbatch(name: str, *args: str) -> None:
    """Queue a held job (it never runs) of this name, a script given ``args``; print its id."""
    script = f"/tmp/hpcatk-{os.getpid()}.sh"
    with open(script, "w") as out:
        out.write("#!/bin/sh\ntrue\n")
    os.chmod(script, 0o755)
    argv = ["sbatch", "--parsable", "-H", "-J", name, "-o", "/dev/null", "-D", "/tmp"]
    proc = subprocess.run([*argv, script, *args], capture_output=True, text=True, check=True)
    print(proc.stdout.strip().split(";")[0], flush=True)


ACTIONS = {
    "sbatch": _sbatch,
    "mkdir": _mkdir,
    "write": _write,
    "overwrite": _overwrite,
    "copy": _copy,
    "read": _read,
    "symlink": _symlink,
    "rename": _rename,
    "remove": _remove,
    "exchange": _exchange,
    "listen": _listen,
    "join": _join,
}


def main(argv: list[str]) -> int:
    action, *args = argv
    _become_attacker()
    try:
        ACTIONS[action](*args)
    except PermissionError as exc:
        print(f"denied: {exc}", flush=True)
        return _DENIED
    except Exception as exc:
        print(f"failed: {type(exc).__name__}: {exc}", flush=True)
        return 1
    print(f"done: {action} {' '.join(args)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.stdout.flush()
    code = main(sys.argv[1:])
    sys.stdout.flush()
    os._exit(code)
