"""Exit codes shared by the training, the submitit wrapper and the rendered scripts."""

from __future__ import annotations

# "I checkpointed on the warning signal: requeue me." Distinct from 1 (error) and 2 (usage),
# and from the 128+N a signal death produces, so a script can tell preemption apart.
REQUEUE_EXIT_CODE = 85
