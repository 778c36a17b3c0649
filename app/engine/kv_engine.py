"""The engine: one model, one context with several sequences, and what each sequence holds.

Everything the CLI and the window do goes through ``Engine``. It keeps, for every sequence,
the exact token ids resident in the KV cache; the radix cache (``engine.cache``) keeps what was
primed or run, runs evaluate in a slot (``engine.slot``: the work context, or a sequence the
cache lends on sliding-window models), and the cold reference
(``engine.cold``) evaluates prompts from scratch in the work context, emptied first, in the
batches of the warm run's history, for the verdict to compare with.
"""
from __future__ import annotations

import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from .llama.batch_feed import feed_batches
from .llama.batch_policy import BatchPolicy
from .runs.cold_reference import ColdReference
from .engine_config import EngineConfig, model_info
from .llama.crash_probe import checked_cpu_kernels
from .engine_kernels import EngineKernels, KernelStatus
from .llama.kernel_choice import KernelChoice
from .llama.memory_budget import (MemoryBudget, check_budget, memory_available, plan_budget,
                                  work_sequences)
from .llama.recurrent_state import measure_recurrent_bytes
from .errors import ContextOverflowError, KvPrimerError, StateFileError
from .llama.model_files import check_gguf_file, default_model_path, model_fingerprint
from .llama.model_traits import read_traits, with_context
from .kv.kv_debug_log import TrackedContext
from .kv.kv_listeners import KvListeners
from .kv.kv_view import KvCacheView, RecurrentLayers, build_view
from .states.llama_state_file import check_rows_fit, read_any_state
from .llama.native import SEQ_STATE_VERSION, ContextParams, NativeModel
from .states.prefix_state import PrefixState
from .states.v_layout import for_context, needs_rewrite
from .cache.engine_access import EngineAccess
from .cache.radix_cache import RadixCache
from .cache.radix_tree import RadixNode
from .prompts.prompt_tokens import PromptTokenizer
from .states.seq_payload import in_position_order, v_transposed
from .kv.sequence_ops import SequenceOps
from .kv.sequence_tokens import SequenceTokens
from .task_state import TaskState
from .prompts.template import FilledPrompt, Template
from .slot.forked_rows import forked_rows
from .slot.forked_slot import forked_slot
from .slot.run_slot import NodeEnd, Slot, runs_forked
from .slot.work_context import WorkContext
from .slot.work_slot import WorkSlot


class Engine:
    def __init__(self, config: EngineConfig = EngineConfig(), *, measure_kernels_later: bool = False,
                 task: TaskState | None = None):
        """Load the model and open its contexts. With flash attention "auto" and no measurement
        to go on, the attention kernels are measured first (``task`` can cancel it), or, with
        ``measure_kernels_later``, the engine opens on the safe default and ``measure_kernels``
        measures when the caller has time (engine_kernels.py)."""
        self.config = config
        path = check_gguf_file(config.model_path or default_model_path())
        self.cpu_kernels = checked_cpu_kernels(path)  # crash-checked in a child process, cached
        self._available = memory_available()  # before the model takes its share
        self.model = NativeModel(path, config.n_gpu_layers, self.cpu_kernels.use_extra_bufts)
        self.kv_listeners = KvListeners(self.kv_view)
        try:
            self._path, self._sha256 = path, model_fingerprint(path)
            self._early = read_traits(self.model, None, path)
            self.config = config = config.for_model(self._early)  # fewer sequences if stateful
            # every context runs one kernel: states move between them, and it decides V's layout
            self.kernel_state = EngineKernels.of(self.model, config, self._sha256, self._early)
            if not measure_kernels_later and self.kernel_state.urgent:
                task = task or TaskState()
                if self.kernel_state.measure(lambda: task.cancelled, task=task) is None:
                    task.check()
            self.tokenizer = PromptTokenizer(self.model)
            self._open_contexts()
        except BaseException:
            self.kernel_state.close() if hasattr(self, "kernel_state") else None
            self.model.close()
            raise

    def _open_contexts(self) -> None:
        """The KV context, the work context (where cold runs evaluate too), the cold
        reference and an empty radix cache, all with the kernel of the current choice."""
        config = self.config
        self.batching = BatchPolicy(config.n_batch)  # where every evaluation's batches start
        self._checked = None  # the last state check_state passed (weakly), for these contexts
        self._flash_attn = self.kernels.flash_attn  # what the contexts run, whatever is chosen
        self.memory = self._memory_budget()  # refused here, before a context takes any of it
        early = self._early
        # an attention-only model without a sliding window evaluates in the work context: the
        # cache's context only holds resident nodes' cells, so it is created (its cells
        # allocated and cleared, in resident memory) when the first one is placed there; a
        # prefix over the resident cap, in the RAM tier, never needs it
        lazy = early.n_swa == 0 and early.family == "attention"
        self.ctx = TrackedContext(self.model, self.context_params(config.n_seq_max),
                                  config.kv_debug_log, early.n_swa > 0, lazy=lazy)
        # the run's sequence, staging, and composed modules' cells held for their turn; cold
        # runs evaluate there too, after the warm run
        self.work = WorkContext(self.model, self.context_params(work_sequences(
            early.family != "attention")), early.family, lambda: self.grouping_exact)
        # what only an open context's memory says (can cells shift?): the work context, where
        # such a model's runs evaluate, is opened for it rather than the cache's
        traits = with_context(early, self.work.ctx if lazy else self.ctx)
        self.info = model_info(self.model, self.ctx, config, self._path, self._sha256,
                               traits, self.kernels, self.cpu_kernels, self.memory)
        # token ids each sequence holds (position i holds seq_tokens[seq][i]) and the
        # sequences that also hold shifted cells; seqs: every change of them (sequence_ops.py)
        self.seq_tokens = SequenceTokens(config.n_seq_max)
        self.seqs = SequenceOps(self.ctx, self.seq_tokens, config.n_seq_max, self.kv_view)
        self.ctx.on_change = self.kv_listeners.changed
        self.cold = ColdReference(self, self.work)
        self.cache = RadixCache(EngineAccess(
            self.ctx, self.seqs, self.seq_tokens, self.model,
            self.info.kv_bytes_per_token, self.batching, config.n_seq_max, self.n_swa > 0,
            self.family, lambda: self.grouping_exact),
            replace(config.cache, ram_bytes=self.memory.tiers_cap))  # its cap as budgeted
        self.work_slot = WorkSlot(self.work, self.cache, self.seqs, self.batching)

    def _memory_budget(self) -> MemoryBudget:
        """What the contexts, the model and the RAM tier will take (memory_budget.py); raises
        MemoryBudgetError when that exceeds the memory available."""
        config, early = self.config, self._early
        rs = (measure_recurrent_bytes(self.model, self.context_params(1))
              if early.recurrent or early.hybrid else 0)
        facts = self.model.facts()
        budget = plan_budget(self.model, config, self._flash_attn, rs, self._available,
                             self.cpu_kernels.use_extra_bufts, facts)
        check_budget(budget, self.model, config, self._flash_attn,
                     self.cpu_kernels.use_extra_bufts, facts)
        return budget

    # ---- the attention kernel (engine_kernels.py)
    @property
    def kernels(self) -> KernelChoice:
        """The attention kernel chosen for this model, and why (measured, set, required…)."""
        return self.kernel_state.choice

    def measure_kernels(self, task: TaskState | None = None, on_status=None) -> KernelStatus:
        """Measure the kernels until done or ``task`` is cancelled (the next call resumes).
        Between jobs only: the other kernel reopens every context, the radix cache empty."""
        task = task or TaskState()
        step = (lambda _p: on_status(self.kernel_state.status())) if on_status else None
        new = self.kernel_state.measure(lambda: task.cancelled, step, task)
        if new is not None:
            if new.flash_attn != self._flash_attn:
                self._switch_kernels()
            self.info = replace(self.info, kernels=new)
        return self.kernel_state.status()

    def _switch_kernels(self) -> None:
        dropped, user = len(self.cache.nodes()), self.seq_tokens.count(0)
        for part in (self.cache, self.work, self.cold, self.ctx):
            part.close()
        self._open_contexts()
        self.kernel_state.switched(dropped, user)

    def note_run(self, warm) -> str | None:
        """Compare a warm run with the kernel measurement (kernel_watch.py); news or None."""
        msg = self.kernel_state.observe_warm(warm)
        self.info = replace(self.info, kernels=self.kernels)  # provisional now, if msg
        return msg

    def context_params(self, n_seq_max: int) -> ContextParams:
        """The engine's context settings and attention kernel, for a context of its own."""
        return self.config.context_params(n_seq_max, self._flash_attn)

    # ---- the run's slot: where runs evaluate is decided once (slot/run_slot.py, runs_forked)
    @property
    def runs_in_work_context(self) -> bool:
        """Warm runs evaluate in the work context (work_context.py), cells laid out as a cold
        run lays them out; sliding-window models fork in the cache's context instead. Modules
        that plan or report a run ask this; those that evaluate take ``slot``."""
        return not runs_forked(self.info.traits)

    @property
    def grouping_exact(self) -> bool:
        """Cells are reused up to any position, not only where a batch ended: the kernel in use
        was measured to compute every cell alike however the tokens are batched
        (kernel_measure.py), runs evaluate in the work context, and the model keeps no recurrent
        state (kept only where a batch ends)."""
        return self.runs_in_work_context and not self.stateful and self.kernels.grouping_exact

    @contextmanager
    def slot(self, cells: int = 0, promote=()) -> Iterator[Slot]:
        """The slot a run evaluates in (slot/run_slot.py): the work context, or on sliding-window
        models a sequence the cache lends, with room for ``cells`` more cells once the nodes in
        ``promote`` (what the run reuses) are resident."""
        if self.runs_in_work_context:
            yield self.work_slot
        else:
            with forked_slot(self.cache, self.seqs, self.seq_tokens, self.ctx, self.evaluate,
                             self.batching, cells, promote) as slot:
                yield slot

    def forked_rows(self, node, k: int, cells: int = 0):
        """A forked batch's slot (slot/forked_rows.py): ``k`` sequences the cache lends beside
        ``node``, made resident, with room for ``cells`` more cells."""
        return forked_rows(self.cache, self.seqs, self.seq_tokens, self.ctx, self.batching,
                           node, k, cells)

    @property
    def slot_context(self):  # the context runs evaluate in: their slot's
        return self.work_slot.ctx if self.runs_in_work_context else self.ctx

    def clear_seq(self, seq: int) -> None:
        """Empty one sequence (the Python API's; the other operations are ``engine.seqs``)."""
        self.seqs.clear(seq)

    def clear_all(self) -> None:
        """Empty every sequence; the cache's nodes lose their cells (not their snapshots)."""
        with self.ctx.held_changes():  # views see the cells and the nodes change together
            self.seqs.clear_all()
            self.cache.lost_sequences()

    def keep_only(self, seq: int) -> None:
        """Drop every other sequence; cells ``seq`` shared with them become its own."""
        with self.ctx.held_changes():
            self.seqs.keep_only(seq)
            self.cache.lost_sequences(kept=seq)

    def clear_cache(self) -> None:
        """Drop every cached prompt and what the work context holds (the user's sequence 0 and
        saved states are theirs and stay)."""
        self.cache.clear()
        self.work.reset()

    # ---- lifetime
    def close(self) -> None:
        self.cache.close()
        self.work.close()
        self.cold.close()
        self.ctx.close()
        self.kernel_state.close()
        self.model.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- tokens
    def tokenize(self, prompt: FilledPrompt) -> list[int]:
        return self.tokenizer.tokenize(prompt)

    @property
    def family(self) -> str:
        """"attention", "hybrid" or "recurrent" (model_traits.py): hybrid and recurrent models
        keep a recurrent state per sequence, which the cache keeps at its nodes' depths."""
        return self.info.traits.family

    @property
    def stateful(self) -> bool:
        return self.family != "attention"

    def refuse_stateful(self, what: str, why: str) -> None:
        """One line for what cannot work on a recurrent state (compose, forked runs, ...)."""
        if self.stateful:
            raise KvPrimerError(f"{what} is not available on {self.info.name or 'this model'}: "
                                f"its recurrent layers {why}; use prefix or chain mode")

    @property
    def n_swa(self) -> int:
        """The sliding-window size (0: every layer attends to the whole context)."""
        return self.info.traits.n_swa

    @property
    def n_ctx(self) -> int:
        """The context's size in cells: a run's prompt and generated tokens fit in it."""
        return self.ctx.n_ctx

    def check_fits(self, n_tokens: int) -> None:
        if n_tokens >= self.n_ctx:
            raise ContextOverflowError(n_tokens, self.n_ctx)

    # ---- evaluation
    def batch_plan(self, seq: int, n_tokens: int, chunk: int | None = None,
                   marks=()) -> list[int]:
        """Where batches start to append ``n_tokens`` to ``seq`` (``BatchPolicy.chunked``),
        for ``evaluate``."""
        start = self.seq_tokens.count(seq)
        return self.batching.chunked(start, start + n_tokens, chunk, marks)

    def evaluate(self, tokens: list[int], seq: int = 0, task: TaskState | None = None,
                 stage: str = "eval", want_logits: bool = True, starts: list[int] | None = None,
                 marks=(), at_mark=None):
        """Append ``tokens`` to sequence ``seq``; return the last logits (or None).

        Batches start at the absolute positions ``starts`` (default plain n_batch batches).
        ``at_mark(position)`` is called at every position in ``marks`` (each a batch start or
        the end) once the tokens before it are in: a forked slot's nodes are forked there.
        Cancelling between batches leaves the sequence holding the tokens evaluated so far."""
        self.seqs.check(seq)
        if self.seq_tokens.is_moved(seq):
            raise KvPrimerError(f"sequence {seq} holds shifted or divided positions; trim it to "
                                f"{self.seq_tokens.count(seq)} tokens or clear it before evaluating")
        start = self.seq_tokens.count(seq)
        end = start + len(tokens)
        self.check_fits(end)
        if starts is None:
            starts = self.batch_plan(seq, len(tokens))
        if any(m not in starts and m != end for m in marks if start <= m <= end):
            raise ValueError("every mark must be where a batch starts or at the end")
        before = (lambda a: at_mark(a) if a in marks else None) if at_mark is not None else None
        feed_batches(self.decode, tokens, start, starts, seq, want_logits=want_logits,
                     task=task, stage=stage, before=before)
        if at_mark is not None and end in marks:
            at_mark(end)
        return self.ctx.logits(-1) if want_logits and tokens else None

    def decode(self, entries: list[tuple[int, int, tuple[int, ...], bool]]) -> None:
        """One llama_decode of (token, position, (seq,), wants logits) entries, possibly for
        several sequences, each entry appending its token to its sequence's tokens (seq_tokens)
        (the sequence owner's, sequence_ops.py; after a failure it trusts llama.cpp's range)."""
        self.seqs.decode(entries)

    # ---- the KV cache view
    def kv_view(self) -> KvCacheView:
        """Every cell's position and owners, and a summary per sequence (see kv_view.py): llama.cpp
        is asked for its cell map now."""
        report, why = self.seqs.report()
        return build_view(report, why, self.ctx.ledger, self.ctx.pos_range, self.config.n_seq_max,
                          self.info.kv_bytes_per_token, self.seq_tokens.counts(),
                          RecurrentLayers.of(self.info.traits, self.ctx))

    def add_kv_listener(self, fn, min_interval_s: float = 0.05) -> None:
        """Call ``fn(view)`` on this (the engine's) thread after KV changes (kv_listeners.py)."""
        self.kv_listeners.add(fn, min_interval_s)

    def remove_kv_listener(self, fn) -> None:
        self.kv_listeners.remove(fn)

    # ---- states
    def sequence_state(self, seq: int = 0, template: Template | None = None,
                       text: str = "", cells: bytes | None = None) -> PrefixState:
        """The state of one sequence (its KV cells only: no logits, no other sequences).
        ``cells``: those cells already copied out in position order (the cache's kept copy
        of a node), taken as they are rather than copied again."""
        self.seqs.check(seq)
        if not self.seq_tokens.count(seq):
            raise KvPrimerError(f"sequence {seq} is empty; prime it first")
        if self.seq_tokens.is_moved(seq):
            raise KvPrimerError(f"sequence {seq} holds shifted or divided positions, which a "
                                f"state cannot describe; trim it to {self.seq_tokens.count(seq)} tokens first")
        return self._prefix_state(
            self.seq_tokens[seq],
            cells if cells is not None else in_position_order(self.ctx.state_get(seq)),
            template, text)

    def _prefix_state(self, tokens, data: bytes, template: Template | None,
                      text: str) -> PrefixState:
        return PrefixState(
            tokens=tuple(tokens), data=data,
            model_sha256=self.info.sha256, model_name=self.info.name or Path(self.info.path).name,
            type_k=self.info.type_k, type_v=self.info.type_v, seq_state_version=SEQ_STATE_VERSION,
            template_sha256=template.sha256 if template else "", text=text,
            prime_timing=self.cold.prime_timing(len(tokens)))

    def check_state(self, state: PrefixState) -> None:
        """Raise StateFileError unless ``state`` fits this model and context. A state is
        checked once per engine set-up: loading a file, adopting it and each run from it all
        ask, and the layout walk costs tens of ms on an 8k-token state."""
        if self._checked is not None and self._checked[0]() is state \
                and self._checked[1] == self._flash_attn:
            return
        self._check_state(state)
        # frozen: what was checked stays what it is
        self._checked = (weakref.ref(state), self._flash_attn)

    def _check_state(self, state: PrefixState) -> None:
        state.check_compatible(self.info.sha256, self.info.type_k, self.info.type_v,
                               SEQ_STATE_VERSION, self.ctx.n_ctx)
        # a state of another family (attention only, hybrid, recurrent) is refused by its layout
        # (a recurrent record's size is fixed per model: the partial state less its header)
        state.check_payload(self.info.n_vocab, self.family,
                            max(self.info.traits.recurrent_state_bytes - 8, 0))
        if state.origin == "llama.cpp" and not self.stateful:  # no identity: rows must fit
            # (a hybrid's attention layers are a subset: llama.cpp checks those rows itself)
            check_rows_fit(state, self.info.n_layer, self.info.kv_bytes_per_token)
        trans = v_transposed(state.data) if self.family != "recurrent" else None
        if trans is not None and self._flash_attn is not None and trans == bool(self._flash_attn):
            # llama.cpp stores V transposed without flash attention and would refuse the rows
            had, now = ("off", "on") if trans else ("on", "off")
            raise StateFileError(f"this state was saved with flash attention {had}, and this "
                                 f"context runs it {now}; load it with flash attention {had} or "
                                 "prime the prefix again")

    def restore(self, state: PrefixState, seq: int = 0) -> float:
        """Put a saved state into ``seq``; returns seconds taken. The context is unchanged on error."""
        self.seqs.check(seq)
        self.check_state(state)
        t0 = time.perf_counter()
        if not self.seqs.restore(seq, state.data, state.tokens):
            raise StateFileError("llama.cpp rejected the state's KV data (layer or row sizes differ); "
                                 "prime the prefix again with this model")
        return time.perf_counter() - t0

    def adopt(self, state: PrefixState, label: str = "saved state") -> RadixNode:
        """Check a saved state against this model, then cache it as a resident node (restored
        once; later runs fork or copy it)."""
        self.check_state(state)
        return self.cache.adopt(state, label)

    def load_state(self, path: str | Path) -> PrefixState:
        """Read and validate a state file against this model and context (does not restore).
        A state primed with the other attention kernel comes back with V rewritten for this
        one (exact: the same values, moved), and ``state.note`` says so."""
        return self.checked_state(read_any_state(path))  # ours or llama.cpp's file

    def checked_state(self, state: PrefixState, rewrite: bool = True) -> PrefixState | None:
        """``state`` checked against this model and context, as ``load_state`` checks a file's
        (V rewritten for this context's kernel when it was primed with the other; None then
        instead when not ``rewrite``)."""
        state.check_compatible(self.info.sha256, self.info.type_k, self.info.type_v,
                               SEQ_STATE_VERSION, self.ctx.n_ctx)
        if self.family != "recurrent":
            if rewrite:
                state = for_context(state, self._flash_attn)
            elif needs_rewrite(state, self._flash_attn):  # else for_context leaves it as it is
                return None
        self.check_state(state)
        return state

    def prime_node(self, template: Template, task: TaskState | None = None,
                   resident: bool = True) -> RadixNode:
        """The radix cache's node holding the template's static prefix, evaluated if needed;
        resident unless ``resident`` is False (a warm run promotes it within its own clock) or
        its cells alone are over the resident cap (it stays in the RAM tier).

        The prefix is evaluated in the run's slot in the batches the policy gives a prime
        (``BatchPolicy.prime``), and given back to the cache as a node."""
        tokens = self.tokenize(template.prefix_prompt())
        if not tokens:
            raise KvPrimerError("the template has no static prefix (it starts with a placeholder); "
                                "nothing to prime")
        self.check_fits(len(tokens))
        hit = self.cache.lookup(tokens)
        with self.cache.busy(hit.node):
            if hit.reused == len(tokens) and hit.node.depth == len(tokens):
                node = hit.node
                if resident and not (node.seq is None and self.cache.too_big_to_reside(
                        node.depth - node.ram_start)):
                    self.cache.materialise(node)
                self.cache.touch(hit.node)
                return hit.node
            with self.slot(len(tokens) - hit.reused, promote=(hit.node,)) as slot:
                hit = slot.whole(hit)
                slot.bring(hit, tokens)
                t0 = time.perf_counter()
                slot.evaluate(tokens[hit.reused:], slot.prime_starts(len(tokens)), task,
                              stage="prime", want_logits=False,
                              nodes=[NodeEnd(len(tokens), "static prefix", template.sha256,
                                             hit.approx)])
                # the prefix's evaluation is the best basis for the next cold run's estimate:
                # the same batches and kernel, at most a suffix shorter
                self.cold.note_evaluation(hit.reused, len(tokens),
                                          (time.perf_counter() - t0) * 1000)
                return slot.flush()[-1]

    def prime(self, template: Template, task: TaskState | None = None) -> PrefixState:
        """Prime the template's static prefix into the radix cache and return its state (to
        save to a file)."""
        node = self.prime_node(template, task)
        if node.seq is None and node.ram is not None and node.ram_start == 0 \
                and not self.stateful:
            # over the resident cap it went to the RAM tier at once: its snapshot of every
            # cell, in position order, is the state (the same bytes, not a copy)
            return self._prefix_state(node.tokens(), node.ram, template,
                                      template.static_prefix)
        if node.seq is None:  # in RAM on top of a resident ancestor: the whole prefix's cells
            self.cache.materialise(node)
        # a stateful model's node sequence holds its recurrent state too (cache_tiers.py);
        # the copy the cache keeps of an attention model's node is those very cells: the
        # state shares its bytes instead of holding a third copy of the prefix
        cells = self.cache.tiers.whole_copy(node) if node.depth == self.seq_tokens.count(
            node.seq) else None
        return self.sequence_state(node.seq, template, template.static_prefix, cells)

