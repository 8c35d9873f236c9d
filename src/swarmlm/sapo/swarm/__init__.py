"""The decentralized swarm's processes: ``swarmlm sapo node`` (:mod:`~swarmlm.sapo.swarm.volunteer`, one
volunteer's process running one SAPO node over the hivemind DHT) and ``swarmlm sapo swarm``
(:mod:`~swarmlm.sapo.swarm.launcher`, N such processes on this machine), with their options
(:mod:`~swarmlm.sapo.swarm.config`)."""
