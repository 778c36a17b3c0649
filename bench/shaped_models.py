"""Random-weight GGUF models with real models' shapes and the default model's tokenizer, for the
scale section of the bench and for the tests: timing, memory and exactness are real; the text
they write is noise.

``SHAPES`` holds the published shapes (Llama 3.2 1B and 3B, Qwen3-1.7B, a Qwen3.5-2B-style
Gated DeltaNet hybrid, Gemma 3 1B with its 5 local : 1 global sliding-window layers), written by
tests/tiny_model.py's architecture writer (``write_arch_model``: which tensors and keys each
architecture needs) with two parts of their own here:
- the tokenizer: every ``tokenizer.*`` key of the default model's GGUF, copied with its types,
  so prompts tokenize as the default model's do (49,152 tokens, its chat markup);
- the weights: the big matrices as random Q4_0 (or Q8_0) blocks made directly from random
  bytes with a scale per block chosen for unit-variance activations (quantizing floats would
  take minutes at this size). Norms are ones, small tensors random floats.
``smollm2-135m-32k`` is the default model's own file with only its context_length rewritten to
32,768 in place (gguf's memory-mapped reader, as gguf_set_metadata.py does): the default model's
weights, declaring the long context it was not trained to.

Why here (bench/) and not in tests/: the bench writes the real-sized files once into the user's
cache and reuses them run after run; the tests import this module for the same shapes at
reduced depth, as the bench already imports tests/tiny_model.py's writer.

Files are cached under <user cache>/kvprimer/shaped-models/, named by shape, depth, weight type,
seed and a hash of everything that decides the bytes, so a changed shape never reuses a stale
file; a file is written beside its name and renamed into place.

`python -m bench.shaped_models NAME [--layers N]` writes (or finds) one and prints its path.
"""
from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import shutil
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

WRITER_VERSION = 1  # bump when the bytes written for the same shape change
DEFAULT_32K = "smollm2-135m-32k"
QUANT_BLOCK = 32
# bytes of one block of 32 weights: a float16 scale d, then 32 values (Q4_0: 4-bit q, w = d (q - 8);
# Q8_0: int8 q, w = d q), and the standard deviation of those q
BLOCK_BYTES = {"q4_0": 18, "q8_0": 34}
Q_STD = {"q4_0": float(np.std(np.arange(16) - 8)), "q8_0": float(np.std(np.arange(-128, 128)))}


@dataclass(frozen=True)
class Shape:
    """A published model's shape (the fields tests/tiny_model.write_arch_model takes)."""
    arch: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_ctx: int  # the context length it declares
    rope_theta: float
    n_swa: int = 0  # gemma3: the sliding window
    swa_pattern: int | None = None  # gemma3: a period of N layers, the last one global
    layout_unit: str = ""  # qwen35: the layers' pattern, repeated (L DeltaNet, A attention)
    delta: tuple[int, int, int] | None = None  # qwen35: DeltaNet head size, key heads, value heads
    tied_output: bool = True
    about: str = ""

    def at_depth(self, n_layer: int) -> "Shape":
        """The same shape with fewer (or more) layers: the tests' reduced-depth models."""
        return replace(self, n_layer=n_layer)

    @property
    def layout(self) -> str | None:
        if not self.layout_unit:
            return None
        unit = self.layout_unit
        return (unit * (self.n_layer // len(unit) + 1))[:self.n_layer]

    @property
    def attention_layers(self) -> int:
        return self.layout.count("A") if self.layout else self.n_layer

    @property
    def kv_bytes_per_token(self) -> int:
        """f16 K and V over every attention layer (a sliding-window layer's cells count too:
        llama.cpp keeps a full-size window cache with a unified KV)."""
        return self.attention_layers * 2 * self.n_head_kv * self.head_dim * 2


SHAPES: dict[str, Shape] = {
    "llama3.2-1b": Shape("llama", 16, 2048, 32, 8, 64, 8192, 131072, 500000.0,
                         about="Llama 3.2 1B"),
    "llama3.2-3b": Shape("llama", 28, 3072, 24, 8, 128, 8192, 131072, 500000.0,
                         about="Llama 3.2 3B"),
    "qwen3-1.7b": Shape("qwen3", 28, 2048, 16, 8, 128, 6144, 40960, 1000000.0,
                        about="Qwen3-1.7B (Q and K norms)"),
    "qwen3.5-2b": Shape("qwen35", 24, 2048, 8, 2, 256, 6144, 262144, 10000000.0,
                        layout_unit="LLLA", delta=(128, 16, 32),
                        about="a Qwen3.5-2B-style hybrid: 18 Gated DeltaNet and 6 attention "
                              "layers"),
    "gemma3-1b": Shape("gemma3", 26, 1152, 4, 1, 256, 6912, 32768, 1000000.0, n_swa=512,
                       swa_pattern=6, about="Gemma 3 1B (window 512, 5 local : 1 global)"),
}


def model_folder() -> Path:
    from platformdirs import user_cache_path

    return user_cache_path("kvprimer", appauthor=False) / "shaped-models"


def default_gguf() -> Path:
    from app.engine.llama.model_files import default_model_path

    return Path(default_model_path())


def _file_id(path: Path) -> str:
    st = path.stat()
    return f"{path.name}:{st.st_size}:{int(st.st_mtime)}"


def shaped_model(name: str, *, n_layer: int | None = None, weight_type: str = "q4_0",
                 seed: int = 0, folder: Path | None = None) -> Path:
    """The model ``name`` (a key of SHAPES, or DEFAULT_32K), written once into ``folder``
    (default: model_folder()); ``n_layer`` another depth (the tests' reduced models)."""
    folder = Path(folder) if folder else model_folder()
    tok = default_gguf()
    if name == DEFAULT_32K:
        return _cached(folder, name, {"from": _file_id(tok), "n_ctx": 32768},
                       lambda out: with_context_length(tok, out, 32768))
    if name not in SHAPES:
        raise KeyError(f"no shape {name!r}; choose one of {', '.join([*SHAPES, DEFAULT_32K])}")
    if weight_type not in BLOCK_BYTES:
        raise ValueError(f"weight type {weight_type!r}: choose one of {', '.join(BLOCK_BYTES)}")
    shape = SHAPES[name] if n_layer is None else SHAPES[name].at_depth(n_layer)
    params = {"shape": asdict(shape), "weight_type": weight_type, "seed": seed,
              "tokenizer": _file_id(tok)}
    tag = f"{name}-{shape.n_layer}l-{weight_type}-s{seed}"
    return _cached(folder, tag, params, lambda out: write_shaped(out, shape, tok, weight_type, seed))


def _cached(folder: Path, tag: str, params: dict, write) -> Path:
    key = hashlib.sha256(json.dumps([WRITER_VERSION, params], sort_keys=True).encode()).hexdigest()
    path = folder / f"{tag}-{key[:10]}.gguf"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        try:
            write(tmp)
            tmp.replace(path)  # a killed run leaves a temp file, never half a model under the name
        finally:
            tmp.unlink(missing_ok=True)
    return path


def with_context_length(src: Path, out: Path, n_ctx: int) -> Path:
    """A copy of ``src`` whose <arch>.context_length says ``n_ctx``: the one value rewritten in
    place (a uint32 keeps its size), everything else byte for byte."""
    import gguf

    shutil.copyfile(src, out)
    reader = gguf.GGUFReader(str(out), "r+")
    arch = reader.get_field("general.architecture").contents()
    field = reader.get_field(f"{arch}.context_length")
    if field is None:
        raise ValueError(f"{src} has no {arch}.context_length key")
    field.parts[field.data[0]][0] = n_ctx
    reader.data.flush()
    del reader
    return out


@functools.lru_cache(maxsize=2)
def tokenizer_copy(path: Path, file_id: str) -> "TokenizerCopy":
    """One TokenizerCopy per file and process: gguf's reader takes seconds over 100,000
    strings. (``file_id``: a changed file is read again.)"""
    return TokenizerCopy(path)


class TokenizerCopy:
    """Writes every tokenizer.* key of a GGUF (the default model's) with its own types."""

    def __init__(self, path: Path):
        import gguf

        reader = gguf.GGUFReader(str(path))
        self.fields = []
        for key, f in reader.fields.items():
            if not key.startswith("tokenizer."):
                continue
            vtype = f.types[0]
            sub = f.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
            self.fields.append((key, f.contents(), vtype, sub))
        self.n_vocab = len(next(v for k, v, _, _ in self.fields if k == "tokenizer.ggml.tokens"))

    def __call__(self, w) -> int:
        for key, value, vtype, sub in self.fields:
            w.add_key_value(key, value, vtype, sub_type=sub)
        return self.n_vocab


def random_blocks_weights(qtype: str):
    """A tests/tiny_model.Weights whose matrices (and token embeddings) are random ``qtype``
    blocks made from random bytes: a 2,048 x 8,192 matrix in milliseconds."""
    import gguf

    from tests.tiny_model import Weights

    gtype = gguf.GGMLQuantizationType[qtype.upper()]

    class RandomBlocks(Weights):
        def mat(self, name: str, n_out: int, n_in: int, scale: float = 0.2) -> None:
            # weights of standard deviation 1/sqrt(n_in): unit-variance outputs of normed inputs
            self.blocks(name, n_out, n_in, 1.0 / np.sqrt(n_in))

        def embedding(self, name: str, n_vocab: int, n_embd: int) -> None:
            self.blocks(name, n_vocab, n_embd, 1.0)

        def blocks(self, name: str, n_out: int, n_in: int, std: float) -> None:
            if n_in % QUANT_BLOCK:
                raise ValueError(f"{name}: {n_in} columns are not whole blocks of {QUANT_BLOCK}")
            per_row = n_in // QUANT_BLOCK
            raw = self.rng.integers(0, 256, size=(n_out, per_row, BLOCK_BYTES[qtype]),
                                    dtype=np.uint8)
            d = np.frombuffer(np.float16(std / Q_STD[qtype]).tobytes(), dtype=np.uint8)
            raw[:, :, 0:2] = d
            self.w.add_tensor(name, raw.reshape(n_out, per_row * BLOCK_BYTES[qtype]),
                              raw_dtype=gtype)

    return RandomBlocks


def write_shaped(path: Path, shape: Shape, tokenizer_gguf: Path, weight_type: str = "q4_0",
                 seed: int = 0) -> Path:
    """Write ``shape`` to ``path`` (no cache: shaped_model is the cached way)."""
    from tests.tiny_model import write_arch_model

    vocab = tokenizer_copy(Path(tokenizer_gguf), _file_id(Path(tokenizer_gguf)))
    weights = random_blocks_weights(weight_type)
    extra = {}
    if shape.arch == "gemma3":
        extra = {"n_swa": shape.n_swa, "swa_pattern": shape.swa_pattern}
    if shape.layout:
        extra["layout"] = shape.layout
    return write_arch_model(
        path, shape.arch, n_embd=shape.n_embd, n_layer=shape.n_layer, n_head=shape.n_head,
        n_head_kv=shape.n_head_kv, n_ff=shape.n_ff, n_ctx=shape.n_ctx, seed=seed,
        weight_type=weight_type, head_dim=shape.head_dim, rope_theta=shape.rope_theta,
        delta=shape.delta, vocab=vocab, weights=weights, tied_output=shape.tied_output,
        name=f"kvprimer-shaped-{shape.arch}-{shape.n_layer}l", **extra)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.shaped_models", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("name", choices=[*SHAPES, DEFAULT_32K])
    ap.add_argument("--layers", type=int, help="another depth (default: the shape's)")
    ap.add_argument("--weight-type", default="q4_0", choices=sorted(BLOCK_BYTES))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    path = shaped_model(args.name, n_layer=args.layers, weight_type=args.weight_type,
                        seed=args.seed)
    print(f"{path} ({path.stat().st_size / 1e6:,.0f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
