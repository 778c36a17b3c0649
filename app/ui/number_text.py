"""How the window writes numbers: "4,096" and "55,068.6", in English whatever the system's
locale, so that the tables, the charts' axes and the settings' spin boxes all read alike.

The tables write theirs with Python's ``f"{n:,}"``; Qt's widgets that write numbers themselves
(QChart's axes, QSpinBox) are given ``NUMBERS``, the locale that writes them the same way.
"""
from __future__ import annotations

from PySide6.QtCore import QLocale

NUMBERS = QLocale(QLocale.English, QLocale.UnitedStates)
