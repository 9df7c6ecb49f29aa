"""Plain facts both sides of a job share: the login node that renders and submits it, and
the compute nodes that run it.

The job protocol's names and numbers (``protocol``), the CPU layout rule (``cpulayout``),
the words that launch ranks (``launch``) and the naming of run folders and their results
(``runs``). Data and pure functions only, standard library only; imports nothing of
hpcdist but ``errors``, so that either side can import it without the other.
"""
