"""zerolaunch: a training launcher with its own ZeRO engine.

Importing the package stays cheap (no torch import): `zerolaunch --help` must answer instantly.
"""

__version__ = "0.1.0"


def initialize(*args, **kwargs):
    """`engine = zerolaunch.initialize(model, config)`; see zerolaunch.api.initialize (imported on first use)."""
    from zerolaunch.api import initialize as _initialize

    return _initialize(*args, **kwargs)
