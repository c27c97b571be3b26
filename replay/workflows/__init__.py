"""workflows: what the CLI commands call, on top of engines, record and check: recording to a file
(record, replay, recover, compare), the CI gate, explore (and its backends), shrink, the pytest plugin.

Imports engines, record and check; nothing below imports it.
"""
