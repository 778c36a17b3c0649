"""Sizes for people: the engine's one way (app/engine/byte_sizes.py), for the window's panels."""
from __future__ import annotations

from ..engine.byte_sizes import size_text

__all__ = ["size_text"]
