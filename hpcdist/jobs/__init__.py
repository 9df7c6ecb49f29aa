"""Submitting and following jobs: submit, records, queries, arrays, local jobs, reports.

What happens on the login node after a job is described: submitit queues the rendered
script (``scriptexec``), the records of this folder (``.hpcdist/jobs``), a job's state,
logs and cancellation. Nothing here runs inside a job. May import ``render``, ``spec``,
``distributed``, ``slurm``, ``state`` and ``errors``; never the CLI.
"""
