"""The benchmarks of nmt, one suite a module, run from the repository root as
`python -m benchmarks SUITE [OPTIONS]` (`python -m benchmarks` lists the suites).

Not part of the installed `nmt` package: the suites measure a checkout. The pieces they share
(the test set, peak memory, child processes, statistics) are in `benchmarks.common`, the
CTranslate2 side of every comparison in `benchmarks.ct2`. docs/benchmarks.md holds the figures,
each with the command that produced it.
"""
