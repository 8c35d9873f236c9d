"""SAPO: swarm sampling policy optimisation (decentralized RL post-training)."""
