"""Running every rank in a container (``--container IMAGE`` or the profile's ``container:``).

Apptainer and Singularity wrap the rank's command (``apptainer exec --nv IMAGE cmd``);
pyxis is srun's own plugin and takes ``--container-image``/``--container-mounts``. Both
keep the job's environment (SLURM_*, MASTER_*, NCCL/GLOO settings, HPCDIST_*): apptainer
passes the host's variables in unless told ``--cleanenv``, which hpcdist refuses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hpcdist.spec.jobspec import JobSpec

WRAPPING_RUNTIMES = ("apptainer", "singularity")


def container_prefix(spec: JobSpec) -> list[str]:
    """The words before the rank's command: ``apptainer exec [--nv] [--bind M].. IMAGE``;
    nothing without a container or under pyxis."""
    if spec.container is None or spec.container_runtime not in WRAPPING_RUNTIMES:
        return []
    words = [spec.container_runtime, "exec"]
    if spec.on_gpus:
        words.append("--nv")  # the host's driver and GPUs inside the container
    words += [f"--bind={mount}" for mount in spec.container_mounts]
    words += spec.container_options
    return [*words, spec.container]


def container_srun_options(spec: JobSpec) -> list[str]:
    """srun's options for a pyxis container; nothing otherwise."""
    if spec.container is None or spec.container_runtime != "pyxis":
        return []
    words = [f"--container-image={spec.container}"]
    if spec.container_mounts:
        words.append(f"--container-mounts={','.join(spec.container_mounts)}")
    return [*words, *spec.container_options]
