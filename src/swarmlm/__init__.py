"""swarmlm: decentralized language-model training (SAPO and NoLoCo)."""

__version__ = "0.1.0"
