"""Private state: folders and files only their owner may write, atomic writes, checkpoint digests.

A bottom layer: imports only ``errors`` (and the standard library).
"""
