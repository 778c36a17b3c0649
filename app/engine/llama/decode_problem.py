"""What a failed llama_decode means, in words: llama.cpp returns a code (1: no free cells, 2:
aborted, -1: an invalid batch, below: a failure), and a user must never see that code as the
message. After -1 llama.cpp has left the memory as it was, so the sequence positions it holds
say which rule the batch broke: a non-empty sequence continues only right after its last
position, and a recurrent state (hybrid and recurrent models) cannot be cut back to allow it.
"""
from __future__ import annotations

import llama_cpp as L


def decode_problem(ctx, rc: int, entries) -> str:
    """What a failed llama_decode of ``entries`` in the NativeContext ``ctx`` means for the
    user, in one line."""
    if rc == 1:
        return ("the KV cache is full: no free cells for this batch; raise the context size "
                "or clear other sequences")
    if rc == 2:
        return "the evaluation was stopped before the batch was done"
    if rc == -1:  # an invalid batch; llama.cpp left the memory as it was, so ask it why
        first: dict[int, int] = {}
        for _tok, pos, seqs, _logits in entries:
            for s in seqs:
                first.setdefault(s, pos)
        for s, pos in first.items():
            if not 0 <= s < ctx.params.n_seq_max:
                return (f"sequence {s} does not exist in this context (it has "
                        f"{ctx.params.n_seq_max}); this is a bug in KV Primer")
            last = L.llama_memory_seq_pos_max(ctx.mem, s)
            if last >= 0 and pos != last + 1:
                stateful = L.llama_model_is_recurrent(ctx.model.ptr) or \
                    L.llama_model_is_hybrid(ctx.model.ptr)
                return (f"sequence {s} ends at position {last}, so llama.cpp cannot evaluate "
                        f"tokens from position {pos} in it" + (
                            " (this model's recurrent state cannot be cut back)" if stateful
                            else "; clear or trim the sequence first"))
        return "llama.cpp refused the batch: a token, position or sequence in it is invalid"
    return ("llama.cpp failed to evaluate the batch (out of memory or a compute error); try a "
            "smaller batch or context size")
