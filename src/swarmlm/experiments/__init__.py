"""Experiments, benchmarks and reports built on the methods: the SAPO sharing experiment (``swarmlm sapo
experiment``), NoLoCo against DiLoCo and data parallel (``swarmlm noloco compare``), the synchronisation benchmark
(``swarmlm noloco sync-bench``), and what they need besides the methods (the simulated clock, the GPipe time
model, statistics and plots). They import the methods; nothing in the methods imports them."""
