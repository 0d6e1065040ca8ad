"""streambandit's benchmarks, run from a source checkout: ``python -m bench.NAME`` (``python -m
bench`` lists them).

Each benchmark module has two halves. ``measure(args) -> dict`` runs the workload and returns
plain data; ``render(result) -> str`` turns that data, and nothing else, into the Markdown report.
``bench.harness.main`` joins them: it adds the machine and the command to the result, writes
``bench/results/NAME.json`` and the report rendered from it as ``bench/results/NAME.md``.
``--render`` rewrites the report from the stored JSON without measuring; ``--quick`` measures
small sizes and prints the report without writing.

What lives here and what ships with the package:

- ``streambandit/benchmarks`` is installed with the package because ``streambandit bench peers``
  is a command users run on their own machine to compare the learners with the libraries they
  would pick instead. It writes where the user says, has tests, and imports nothing from here.
- ``bench/`` measures the project itself for its own results (``bench/results/``): the worker on
  the embedded broker, memory at scale, recovery, per-stage CPU. It needs a checkout, may use any
  module of the package, and nothing in the package imports it.

Importing this package pins BLAS to one thread before numpy is loaded: the figures are per core,
and the machines the results come from have two shared cores.
"""

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
