"""Where the KV map's blocks go: how many cells a block holds and how many pixels it takes, to fit
the room or zoomed in (plain arithmetic, no Qt)."""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

FIT_PX = (4, 16)  # pixels per block when the map fits its room: below 4 blocks are gathered
ZOOM_PX = 32  # the largest cells zooming in makes


@dataclass(frozen=True)
class MapLayout:
    """How the map lays out: ``k`` cells per block, blocks of ``px`` pixels, ``cols`` x ``rows``."""
    k: int
    px: int
    cols: int
    rows: int

    @property
    def height(self) -> int:
        return self.rows * self.px


def _grid(n: int, k: int, px: int, width: int) -> MapLayout:
    cols = max(1, width // px)
    return MapLayout(k, px, cols, -(-(-(-n // k)) // cols))


@lru_cache(maxsize=64)  # asked on every paint and hover, for the same few sizes
def fit_layout(n: int, width: int, height: int) -> MapLayout:
    """The largest blocks of the fewest cells (1, 2, 4, ...) with which ``n`` cells fit
    ``width`` x ``height`` pixels."""
    lo, hi = FIT_PX
    k = 1
    while True:
        for px in range(hi, lo - 1, -1):
            lay = _grid(n, k, px, width)
            if lay.height <= height:
                return lay
        if k >= max(n, 1):
            return _grid(n, k, lo, width)
        k *= 2


def zoomed(fit: MapLayout, steps: int, n: int, width: int) -> MapLayout:
    """``steps`` zoom steps in from ``fit``: each halves the cells per block, and at one cell
    per block doubles its pixels (up to ``ZOOM_PX``)."""
    k, px = fit.k, fit.px
    for _ in range(max(steps, 0)):
        if k > 1:
            k //= 2
        elif px < ZOOM_PX:
            px = min(px * 2, ZOOM_PX)
    return fit if (k, px) == (fit.k, fit.px) else _grid(n, k, px, width)


def max_zoom_steps(fit: MapLayout) -> int:
    """Zoom steps until one cell per block at ``ZOOM_PX`` pixels."""
    steps, k, px = 0, fit.k, fit.px
    while k > 1 or px < ZOOM_PX:
        k, px = (k // 2, px) if k > 1 else (k, min(px * 2, ZOOM_PX))
        steps += 1
    return steps
