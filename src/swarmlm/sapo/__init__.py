"""SAPO: Swarm sAmpling Policy Optimization (Gensyn; "Sharing is Caring: Efficient LM Post-Training with
Collective RL Experience Sharing", arXiv 2509.08721), decentralized RL post-training in which every node trains its
own policy and shares its rollouts as text. (Not the "Soft Adaptive Policy Optimization" that TRL and verl call
``sapo``.)

A node (:mod:`.node`) plays a round (generate with an engine from :mod:`.engines`, score, publish through a
transport from :mod:`.transports`) and learns from it (collect and check others' records, :mod:`.records`; pick
J external groups, :mod:`.selection`; one GRPO update, :mod:`.update` and :mod:`.grpo`). :mod:`.simulate` runs N
nodes on one machine; :mod:`.swarm` runs a node of the open, decentralized swarm.
"""
