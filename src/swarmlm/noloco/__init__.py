"""NoLoCo: low-communication pre-training without all-reduce, with DiLoCo and data-parallel baselines."""
