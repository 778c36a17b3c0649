"""ggml's tensor types: block sizes of every type a GGUF file may hold, and the types a KV cache
may use, by the names llama.cpp's tools give them (-ctk/-ctv).

Free of llama.cpp so that model and state files can be checked without loading it. The ids are
ggml's `enum ggml_type`, stable across builds; tests check them against llama-cpp-python's
constants and the block sizes against the gguf package.
"""
from __future__ import annotations

from dataclasses import dataclass

# ggml type id -> (elements per block, bytes per block), as gguf.constants.GGML_QUANT_SIZES
GGML_BLOCKS: dict[int, tuple[int, int]] = {
    0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
    9: (32, 40), 10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210),
    15: (256, 292), 16: (256, 66), 17: (256, 74), 18: (256, 98), 19: (256, 50), 20: (32, 18),
    21: (256, 110), 22: (256, 82), 23: (256, 136), 24: (1, 1), 25: (1, 2), 26: (1, 4),
    27: (1, 8), 28: (1, 8), 29: (256, 56), 30: (1, 2), 34: (256, 54), 35: (256, 66),
    39: (32, 17)}
# ggml type id -> its name, as gguf.constants.GGMLQuantizationType spells it
GGML_TYPE_NAMES: dict[int, str] = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1",
    10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 16: "IQ2_XXS",
    17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S",
    23: "IQ4_XS", 24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64", 29: "IQ1_M", 30: "BF16",
    34: "TQ1_0", 35: "TQ2_0", 39: "MXFP4"}


@dataclass(frozen=True)
class GgmlType:
    name: str
    id: int

    @property
    def block_size(self) -> int:
        """Elements per block."""
        return GGML_BLOCKS[self.id][0]

    @property
    def block_bytes(self) -> int:
        return GGML_BLOCKS[self.id][1]

    def row_bytes(self, n: int) -> int:
        """Bytes of a row of ``n`` elements (a multiple of the block size)."""
        return n // self.block_size * self.block_bytes


# the KV cache types, in the order the CLI lists them
KV_TYPES: dict[str, GgmlType] = {t.name: t for t in (
    GgmlType("f32", 0), GgmlType("f16", 1), GgmlType("bf16", 30), GgmlType("q8_0", 8),
    GgmlType("q4_0", 2), GgmlType("q4_1", 3), GgmlType("q5_0", 6), GgmlType("q5_1", 7),
    GgmlType("iq4_nl", 20))}
KV_TYPES_BY_ID: dict[int, GgmlType] = {t.id: t for t in KV_TYPES.values()}


def kv_bytes_per_token(facts: dict, type_k: str, type_v: str) -> int:
    """Bytes one token's K and V rows take over the attention layers: ``facts["kv_heads"]``
    lists each one's KV heads (a hybrid's recurrent layers have none); without it, every one
    of the ``n_layer`` layers has ``n_head_kv``."""
    heads = facts.get("kv_heads")
    if heads is None:
        heads = [facts["n_head_kv"]] * facts["n_layer"]
    return sum(KV_TYPES[type_k].row_bytes(n * facts["head_dim_k"])
               + KV_TYPES[type_v].row_bytes(n * facts["head_dim_v"]) for n in heads)
