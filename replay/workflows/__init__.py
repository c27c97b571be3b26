"""workflows: what users run on top of record and check: the CI gate, explore, shrink.

Imports engines, record and check; nothing below imports it.
"""
