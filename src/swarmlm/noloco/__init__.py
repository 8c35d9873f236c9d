"""NoLoCo: No-all-reduce Low Communication pre-training (arXiv 2506.10911), with DiLoCo (arXiv 2311.08105) and data
parallel as its baselines.

A replica (:mod:`.replica`) takes inner steps (:mod:`.inner_step`; one pipeline stage per process with
:mod:`.pipeline`) and every H steps an outer step: the maths in :mod:`.outer`, the groups in :mod:`.groups`, the
communication in :mod:`.comm`. :mod:`.launch` starts the ranks; :mod:`.data` feeds them.
"""
