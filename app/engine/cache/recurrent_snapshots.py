"""The recurrent state a radix node keeps at its depth, on hybrid and recurrent models.

Such a model's sequence holds, besides attention cells, one recurrent state that stands at the
sequence's end and cannot be cut back, so a run can resume only where that state was kept. Each
node a run may resume from keeps it (``rs``: llama.cpp's partial state, the recurrent part only)
beside its cells, wherever they are: in memory while the node is resident or in RAM (counted in
that tier's bytes), in a file of its own next to the node's cells in the file tier. CacheTiers
(cache_tiers.py) moves it with the cells; these are the moves.
"""
from __future__ import annotations

from pathlib import Path

from ..errors import CacheError
from .radix_tree import RadixNode


def read_node_file(path: str) -> bytes:
    """A node's file (its cells or its recurrent state), or a CacheError saying it is gone."""
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise CacheError(f"a cached prompt's file is gone ({e}); run it again") from None


class RecurrentSnapshots:
    def __init__(self):
        self._largest_rs = 0  # bytes of the largest recurrent state seen (the default cap)

    def hold_rs(self, node: RadixNode, data: bytes) -> None:
        """``node`` (holding cells) gets the recurrent state at its depth."""
        self.forget_rs(node)
        node.rs, node.rs_bytes = data, len(data)
        node.nbytes += len(data)
        self._largest_rs = max(self._largest_rs, len(data))

    def rs_of(self, node: RadixNode) -> bytes:
        """The recurrent state at ``node``'s depth, wherever it is."""
        if node.rs is not None:
            return node.rs
        if node.rs_file is None:
            raise CacheError("that cached prompt has no recurrent state; run it again")
        return read_node_file(node.rs_file)

    def forget_rs(self, node: RadixNode) -> None:
        if node.rs_file:
            Path(node.rs_file).unlink(missing_ok=True)
        node.nbytes -= node.rs_bytes if node.nbytes >= node.rs_bytes else 0
        node.rs, node.rs_file, node.rs_bytes = None, None, 0

    @staticmethod
    def rs_to_file(node: RadixNode, folder: Path) -> None:
        """The node moves to the file tier: its recurrent state goes to a file too."""
        if node.rs is not None:
            path = folder / f"node-{node.id}.kvrecurrent"
            path.write_bytes(node.rs)
            node.rs_file, node.rs = str(path), None

    @staticmethod
    def rs_from_file(node: RadixNode) -> None:
        """The node is promoted from the file tier: its recurrent state comes back to memory."""
        if node.rs_file is not None:
            node.rs = read_node_file(node.rs_file)
            Path(node.rs_file).unlink(missing_ok=True)
            node.rs_file = None
