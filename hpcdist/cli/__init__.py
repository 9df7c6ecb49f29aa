"""The ``hpcdist`` command line (top layer): flags in, one line of error or the result out.

Owns the click commands and nothing else: each subcommand module asks the rooms below it
(``jobs``, ``render``, ``spec``, ``distributed``, ``slurm``, ``state``) to do the work.
May import every room; nothing imports it.
"""

from __future__ import annotations
