"""Names vulture (dead-code finder, `make lint`) cannot see used, each with the reason it is kept.

Every entry is a use that happens outside Python's static view: called by a framework, a protocol or reflection.
"""
