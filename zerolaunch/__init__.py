"""zerolaunch: a training launcher with its own ZeRO engine.

Importing the package stays cheap (no torch import): `zerolaunch --help` must answer instantly.
"""

__version__ = "0.1.0"
