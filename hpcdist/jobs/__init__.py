"""Submitting and following jobs: submit, records, queries, arrays, local jobs, reports.

What happens on the login node after a job is described: submitit's executor, the records
of this folder (``.hpcdist/jobs``), a job's state, logs and cancellation, and what a
submitit task runs inside the job (``command_job``). May import ``render``, ``spec``,
``distributed``, ``slurm``, ``state`` and ``errors``; never the CLI.
"""
