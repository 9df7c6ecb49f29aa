"""The job's warning signal (``--signal``), read one way by every side that reads it.

SLURM's grammar is ``[{B,R}...:]SIGNAL[@SECONDS]``: flags in any case and order (``B``: the
batch shell alone gets it; ``R``: the job may overlap a reservation), a signal name in any
case with or without ``SIG``, or its number, and the lead in seconds (60 where none is
given). ``render`` and ``submit`` check it (``hpcdist.spec.grammar``), the script's runner
passes it on to the ranks (``hpcdist.distributed.jobstep``), the local executor delivers it
(``hpcdist.distributed.localstep``) and the advice leaves its lead; all of them through
``parse_warning``, so that no spelling SLURM takes is lost on one side.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# SLURM's own lead where --signal names none (sbatch(1): ``--signal=USR2`` means ``USR2@60``).
SLURM_DEFAULT_LEAD_S = 60
MAX_LEAD_S = 65535  # SLURM keeps the warning time in 16 bits

SIGNAL_NUMBERS = {
    "HUP": 1,
    "INT": 2,
    "QUIT": 3,
    "ABRT": 6,
    "KILL": 9,
    "USR1": 10,
    "USR2": 12,
    "ALRM": 14,
    "TERM": 15,
    "CONT": 18,
    "STOP": 19,
    "TSTP": 20,
    "TTIN": 21,
    "TTOU": 22,
    "URG": 23,
    "XCPU": 24,
    # Names SLURM 22.05 refuses and 24.11 takes; none of them is a warning a job catches.
    "ILL": 4,
    "TRAP": 5,
    "BUS": 7,
    "FPE": 8,
    "SEGV": 11,
    "PIPE": 13,
    "CHLD": 17,
    "XFSZ": 25,
    "VTALRM": 26,
    "PROF": 27,
    "WINCH": 28,
    "IO": 29,
    "POLL": 29,
    "PWR": 30,
    "SYS": 31,
}
_SIGNAL_NAMES = {number: name for name, number in reversed(SIGNAL_NUMBERS.items())}
# The warnings a job can catch and checkpoint on (the runner traps them).
WARNING_SIGNALS = ("USR1", "USR2", "TERM", "INT", "HUP", "URG", "CONT")
_WARNING = re.compile(r"(?:([BRbr]+):)?([A-Za-z0-9]+)(?:@([0-9]*))?")


@dataclass(frozen=True)
class WarningSignal:
    """A ``--signal`` as SLURM reads it: the signal's name without SIG (``USR2`` of
    ``b:sigusr2@90``, ``"34"`` for a number without a name), whether the batch shell alone
    gets it (``B`` among the flags), and the seconds between the warning and the end."""

    name: str
    batch_shell: bool
    lead_s: int

    @property
    def number(self) -> int:
        """The signal's number (12 of USR2)."""
        return SIGNAL_NUMBERS[self.name] if self.name in SIGNAL_NUMBERS else int(self.name)

    @property
    def catchable(self) -> bool:
        """Whether the job can catch it to checkpoint (``WARNING_SIGNALS``)."""
        return self.name in WARNING_SIGNALS


def parse_warning(value: str) -> WarningSignal | None:
    """``USR2@90``, ``SIGUSR2@90``, ``12@90``, ``RB:usr2``, ``b:USR1@120`` -> WarningSignal;
    None for a value SLURM does not take (an unknown name, signal 0, a lead over 16 bits)."""
    match = _WARNING.fullmatch(value)
    if match is None:
        return None
    flags, text, lead = match.groups()
    name = _signal_name(text)
    # A lead of more digits than 16 bits hold is refused before int() reads it.
    if name is None or (lead and (len(lead) > 5 or int(lead) > MAX_LEAD_S)):
        return None
    return WarningSignal(name, "B" in (flags or "").upper(), int(lead or SLURM_DEFAULT_LEAD_S))


def _signal_name(text: str) -> str | None:
    """The signal's name without SIG, of a name in any case or a number; None if unknown.
    A number SLURM takes but hpcdist has no name for is named by its number."""
    if text.isdigit():
        if len(text) > 3 or int(text) == 0:
            return None
        return _SIGNAL_NAMES.get(int(text), str(int(text)))
    upper = text.upper()
    upper = upper.removeprefix("SIG")
    return upper if upper in SIGNAL_NUMBERS else None
