"""Tests of the whole tool, end to end, that belong to no one package: hostile input fed to every
command (test_fuzz), the same trace on repeat, in other processes and with --jobs
(test_determinism), memory that does not grow with a trace (test_bounded_memory). Tests of one
package's code live under that package's mirror (tests/README.md)."""
