"""Errors a user can cause. The CLI prints them as one line and exits 2."""

from __future__ import annotations


class UserError(ValueError):
    """A mistake in what the user asked for: a flag, a profile, a node list, a file."""


class SpecError(UserError):
    """A job request that cannot be rendered or submitted as given."""


class ProfileError(UserError):
    """A cluster profile that is missing, unreadable or malformed."""
