"""A context is made for one row of logits per sequence (native.py's n_outputs_max); a batch
asking for more gets one clear error instead of llama.cpp's abort, and the context stays
usable."""
import pytest

from app.engine.errors import ContextError
from app.engine.llama.native import ContextParams, NativeContext, NativeModel


@pytest.fixture
def tiny(tiny_model):
    model = NativeModel(tiny_model)
    yield model
    model.close()


def test_a_batch_asking_for_more_logits_than_the_context_holds_is_refused(tiny):
    ctx = NativeContext(tiny, ContextParams(n_ctx=128, n_batch=16, n_seq_max=2))
    try:
        every = [(5 + i, i, (0,), True) for i in range(3)]
        with pytest.raises(ContextError, match="asks for 3 tokens' logits, more than the 2"):
            ctx.decode(every)
        ctx.decode([(5 + i, i, (0,), i == 2) for i in range(3)])  # the last token's only
        assert ctx.logits(-1).shape == (tiny.n_vocab,)
        ctx.decode([(9, 3, (0,), True), (9, 0, (1,), True)])  # one per sequence
        assert ctx.logits(-1).shape == (tiny.n_vocab,)
    finally:
        ctx.close()
