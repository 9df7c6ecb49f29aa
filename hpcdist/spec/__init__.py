"""Describing a job: JobSpec, options, profiles, site options, validation, sweeps, dependencies.

A JobSpec is the one place a job's resources live; each field is declared once
(``joboption.job_field``) and the flags, defaults and profile keys come from those
declarations. May import ``distributed``, ``slurm``, ``state`` and ``errors``; never
``render``, ``jobs`` or the CLI.
"""
