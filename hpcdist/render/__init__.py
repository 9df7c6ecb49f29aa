"""Rendering a JobSpec: SLURM directives, srun's options, containers, the sbatch script.

``directives`` builds the request once (``#SBATCH`` lines, srun options, the command each
task runs); ``script`` renders it through the Jinja templates; ``hpcscripts`` keeps the
committed ``hpc/*.sh`` in step. May import ``spec``, ``distributed``, ``slurm``, ``state``
and ``errors``; never ``jobs`` or the CLI.
"""
