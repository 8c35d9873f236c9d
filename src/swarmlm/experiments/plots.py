"""matplotlib for the experiments' plots, an optional dependency (``pip install 'swarmlm[plots]'``): the
commands check for it before they start, and draw off-screen (the Agg backend)."""

from __future__ import annotations

from typing import Any

from swarmlm.config import ConfigError

INSTALL_HINT = "pip install 'swarmlm[plots]'"


def require_matplotlib(command: str) -> None:
    """Fail at once, with the install command, where matplotlib is missing (``command`` names who needs it)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ConfigError(f"{command} draws its plots with matplotlib, which is not installed: {INSTALL_HINT}") from None


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the off-screen Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
