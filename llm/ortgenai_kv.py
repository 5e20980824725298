"""The builder's decoder model run by onnxruntime itself, with keys and values kept in numpy.

onnxruntime-genai's Python binding holds the GIL through every step and batches only statically
on CPU; its model file is a plain ONNX graph, though, which onnxruntime's own InferenceSession
runs with the GIL released. Its attention is GroupQueryAttention, whose CPU kernel (onnxruntime
contrib_ops/cpu/bert/group_query_attention*.{h,cc}) takes every row's length from the attention
mask (`seqlens_k` = row sum - 1, `total_sequence_length` = mask width) and:
- in a decode step (one new token per row) places each row's token at its own length and attends
  over that row's tokens only, so rows of different lengths, right-padded, batch together;
- takes a prompt piece of several tokens after a past only at batch 1 (`is_subsequent_prompt`),
  so prompts are computed one request at a time (`prefill`), decode steps for all (`decode`);
- writes the new keys and values in place when `present.*` is bound to the very buffer given
  as `past_key_values.*` (past_present_share_buffer, as onnxruntime-genai runs it): no copy of
  the whole cache per step, only a buffer as long as the longest row.

Numerics (measured on SmolLM2-135M int4, MatMulNBits accuracy_level 4): at batch 1 this gives
the same logits as og's Generator, token for token. A step of several rows (a decode of two or
more, a prompt piece of two or more tokens) runs other MatMulNBits kernels than a step of one
row, but gives each row the same result whatever the other rows are: see ortgenai_batch.py.
"""

from __future__ import annotations

import json
import logging
import mmap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from ferry.llm import logits_positions

logger = logging.getLogger(__name__)
Hook = Callable[[], None] | None


@dataclass
class KVBlock:
    """Keys and values of `rows` sequences, room for `length` tokens each:
    [layers, rows, kv heads, length, head size] float32 arrays."""

    keys: np.ndarray
    values: np.ndarray

    @property
    def rows(self) -> int:
        return int(self.keys.shape[1])

    @property
    def length(self) -> int:
        return int(self.keys.shape[3])

    def copy_row(self, source: KVBlock, src_row: int, dst_row: int, tokens: int) -> None:
        """Copy the first `tokens` positions of `source`'s row into one of ours."""
        self.keys[:, dst_row, :, :tokens] = source.keys[:, src_row, :, :tokens]
        self.values[:, dst_row, :, :tokens] = source.values[:, src_row, :, :tokens]

    def nbytes(self) -> int:
        return self.keys.nbytes + self.values.nbytes


# A binding, the block it points into, and the rows it was made for.
KeptBinding = tuple[KVBlock, int, ort.IOBinding]


class KVModel:
    """An onnxruntime-genai model folder's decoder on an InferenceSession. Not thread-safe:
    one owner thread runs it (the session releases the GIL inside `run`)."""

    def __init__(self, model_dir: Path, intra_op_threads: int = 0, *, spin_us: int = 0) -> None:
        self.model_dir = model_dir
        config = json.loads((model_dir / "genai_config.json").read_text())["model"]
        decoder = config["decoder"]
        self.layers: int = decoder["num_hidden_layers"]
        self.heads: int = decoder.get("num_key_value_heads", decoder["num_attention_heads"])
        self.head_size: int = decoder["head_size"]
        names = decoder["inputs"]
        self._ids_name = names["input_ids"]
        self._mask_name = names["attention_mask"]
        past_k, past_v = names["past_key_names"], names["past_value_names"]
        present_k = decoder["outputs"]["present_key_names"]
        present_v = decoder["outputs"]["present_value_names"]
        self._kv_names = [
            (past_k % layer, past_v % layer, present_k % layer, present_v % layer)
            for layer in range(self.layers)
        ]
        self._logits_name = decoder["outputs"]["logits"]
        options = ort.SessionOptions()
        options.log_severity_level = 3  # LoRA-ready models warn about every adapter input
        options.intra_op_num_threads = intra_op_threads  # 0: one per physical core, as og
        # No spinning: pool threads left spinning between ops and runs take the cores from the
        # event loop and the owner thread; on 2 shared cores spinning made decode 1.5-2x slower
        # than og's Generator, without it they are level (backends/ort_session.py says the same).
        # `spin_us` > 0 lets them spin that long before they sleep (bench.llm_int4 measures it).
        options.add_session_config_entry("session.intra_op.allow_spinning", str(int(spin_us > 0)))
        if spin_us > 0:
            options.add_session_config_entry("session.intra_op.spin_duration_us", str(spin_us))
        graph_file = model_dir / decoder["filename"]
        rewritten = logits_positions.rewrite(graph_file, self._logits_name)
        # Logits only where they are read (logits_positions.py); else every position's.
        self._positions = rewritten is not None
        if rewritten is None:
            logger.info("%s: LM head not recognised, logits at every position", graph_file)
            graph: str | bytes = str(graph_file)
        else:
            folder = "session.model_external_initializers_file_folder_path"
            options.add_session_config_entry(folder, str(model_dir))
            graph = rewritten
        self._session = ort.InferenceSession(graph, options, providers=["CPUExecutionProvider"])
        types = {i.name: i.type for i in self._session.get_inputs()}
        self._ids_dtype = np.int32 if types[self._ids_name] == "tensor(int32)" else np.int64
        self._mask_dtype = np.int32 if types[self._mask_name] == "tensor(int32)" else np.int64
        logits = next(o for o in self._session.get_outputs() if o.name == self._logits_name)
        self._logits_dtype = np.float16 if logits.type == "tensor(float16)" else np.float32
        width = logits.shape[-1]
        self._vocab: int = width if isinstance(width, int) else config["vocab_size"]
        # A cached binding is kept with its block and found by the block itself: keyed by
        # id(block.keys), a mapped block's arrays could die (the binding holds only the mmap)
        # and a new block's array take that id, then decode through the stale binding.
        self._decode_binding: KeptBinding | None = None
        self._piece_binding: KeptBinding | None = None

    @property
    def token_bytes(self) -> int:
        """Bytes of keys and values one token takes in every layer."""
        return self.layers * 2 * self.heads * self.head_size * 4

    def new_block(self, rows: int, length: int, *, mapped: bool = False) -> KVBlock:
        """`mapped`: on fresh pages of an anonymous mmap, which the OS zeroes as they are first
        written: rows never written take no memory and cost nothing to make. (numpy's zeros
        may come from the heap and be cleared whole: ~15 ms for SmolLM2's 16 rows x 256.)"""
        shape = (self.layers, rows, self.heads, length, self.head_size)
        if not mapped:
            return KVBlock(np.zeros(shape, np.float32), np.zeros(shape, np.float32))
        size = int(np.prod(shape)) * np.dtype(np.float32).itemsize
        keys, values = (
            np.frombuffer(mmap.mmap(-1, size), np.float32).reshape(shape) for _ in range(2)
        )
        return KVBlock(keys, values)

    def prefill(
        self, block: KVBlock, row: int, done: int, ids: list[int], *, before_run: Hook = None
    ) -> np.ndarray:
        """Run `ids` after the `done` tokens row `row` of `block` holds (room for all of them);
        their keys and values land in the row. Returns the last position's logits.
        `before_run` (here and below): called once the inputs are bound, right before the
        forward pass releases the GIL (the owner loop hands its deltas over there)."""
        # The last two positions, not one: a head of one row rounds otherwise (logits_positions).
        last: np.ndarray = self._piece(block, row, done, ids, 2, False, before_run)[-1]
        return last

    def prefill_every(
        self,
        block: KVBlock,
        row: int,
        done: int,
        ids: list[int],
        *,
        keep: bool = False,
        before_run: Hook = None,
    ) -> np.ndarray:
        """`prefill`, returning every position's logits, [len(ids), vocab]: row i scores the
        token after ids[i] (`echo` and speculation read them all).
        What the row held past `done` is overwritten: a shorter `done` rolls the row back.
        `keep`: bind this row once for the calls after too (speculation's checks on the decode
        block; binding 30 layers costs ~1.5 ms), until `forget_bindings`."""
        return self._piece(block, row, done, ids, len(ids), keep, before_run)

    def _piece(
        self,
        block: KVBlock,
        row: int,
        done: int,
        ids: list[int],
        positions: int,
        keep: bool,
        before_run: Hook,
    ) -> np.ndarray:
        """Logits of the last `positions` of `ids` (at most all of them), run after `done`."""
        total = done + len(ids)
        assert total <= block.length
        mask = np.ones((1, total), self._mask_dtype)
        tokens = np.asarray([ids], self._ids_dtype)
        binding = _kept_binding(self._piece_binding, block, row)
        if binding is None:
            binding = self._bind(block, slice(row, row + 1))
            self._piece_binding = (block, row, binding) if keep else None
        first = max(0, len(ids) - positions)
        logits: np.ndarray = self._run(binding, tokens, mask, before_run, first)[0]
        return logits

    def decode(
        self,
        block: KVBlock,
        rows: int,
        lengths: np.ndarray,
        tokens: np.ndarray,
        *,
        before_run: Hook = None,
    ) -> np.ndarray:
        """One new token for each of the first `rows` rows of `block`, after `lengths[i]` tokens
        each (every length + 1 fits the block). Returns [rows, vocab] logits."""
        width = int(lengths.max()) + 1
        assert width <= block.length
        mask = (np.arange(width) <= lengths[:, None]).astype(self._mask_dtype)
        binding = _kept_binding(self._decode_binding, block, rows)
        if binding is None:
            binding = self._bind(block, slice(0, rows))
            self._decode_binding = (block, rows, binding)
        ids = np.asarray(tokens, self._ids_dtype).reshape(rows, 1)
        return self._run(binding, ids, mask, before_run, 0)[:, -1]

    def forget_bindings(self) -> None:
        """Drop the cached bindings (they hold the block they were made for)."""
        self._decode_binding = self._piece_binding = None

    def _bind(self, block: KVBlock, rows: slice) -> ort.IOBinding:
        binding = self._session.io_binding()
        for layer, (past_k, past_v, present_k, present_v) in enumerate(self._kv_names):
            for past, present, array in (
                (past_k, present_k, block.keys[layer, rows]),
                (past_v, present_v, block.values[layer, rows]),
            ):
                value = ort.OrtValue.ortvalue_from_numpy(array)  # a view: written in place
                binding.bind_ortvalue_input(past, value)
                binding.bind_ortvalue_output(present, value)
        return binding

    def _run(
        self,
        binding: ort.IOBinding,
        ids: np.ndarray,
        mask: np.ndarray,
        before_run: Hook,
        first: int,
    ) -> np.ndarray:
        """The forward pass; logits [rows, positions, vocab] of the positions from `first` on
        (every position where the graph computes them all)."""
        binding.bind_cpu_input(self._ids_name, ids)
        binding.bind_cpu_input(self._mask_name, mask)
        rows, width = ids.shape
        if self._positions:
            binding.bind_cpu_input(
                logits_positions.POSITIONS, np.arange(first, width, dtype=np.int64)
            )
            width -= first
        # The logits land in an array of ours: reading ORT's own back (IOBinding.get_outputs)
        # wraps every output, the 2 x layers keys and values too, ~0.2 ms a step in Python.
        logits = np.empty((rows, width, self._vocab), self._logits_dtype)
        binding.bind_ortvalue_output(self._logits_name, ort.OrtValue.ortvalue_from_numpy(logits))
        if before_run is not None:
            before_run()
        self._session.run_with_iobinding(binding)
        return logits


def _kept_binding(kept: KeptBinding | None, block: KVBlock, rows: int) -> ort.IOBinding | None:
    """The cached binding if it was made for `block` and `rows` (a row, or a count of rows)."""
    if kept is not None and kept[0] is block and kept[1] == rows:
        return kept[2]
    return None
