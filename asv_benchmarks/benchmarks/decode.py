"""A decode step: every call of issue 18's table beside the framework's own code, and patch_hf.

The cases are ``posenc._bench_decode``'s (``posenc bench`` prints the same table): one new
token after a cache of 511, heads ``[1, 32, 1, 128]`` and ``[1, 8, 1, 128]``, biases of 16
heads over 512 keys. ``time_posenc`` times ``CALLS`` calls of posenc's side alone (so that
one sample, as ``asv run --quick`` takes, is not one timer tick); ``track_ratio`` times
posenc and the framework's code in turns on one thread (``common.floor_ratio``: best round
of 20 calls each, rounds for at least 2 s) and reports posenc's time over the framework's
(lower is better; the goal is 1.5, 1.0 for T5). The torch rows skip without torch and transformers.
``Generate`` tracks patched over unpatched ``generate()`` and prefill of the LLaMA-like
model (``posenc._bench_generate``), float32 and bfloat16, measured once in ``setup_cache``.
"""

from __future__ import annotations

import importlib.util

from .common import floor_ratio, require

CALLS = 100  # calls of one decode step per ``time_posenc`` sample

if importlib.util.find_spec("torch") is not None and importlib.util.find_spec("transformers") is not None:
    # Imported with the suite (once, in asv's forkserver), not in each benchmark's process.
    import transformers.models.llama.modeling_llama  # noqa: F401
    import transformers.models.qwen2_vl.modeling_qwen2_vl  # noqa: F401
    import transformers.models.t5.modeling_t5  # noqa: F401


def _cases(name):
    from posenc import _bench_decode

    if "numpy" in name:
        return _bench_decode.numpy_cases()
    try:
        torch = require("torch")
        require("transformers")
    except NotImplementedError as missing:
        raise NotImplementedError(f"{name}: {missing}") from None
    return _bench_decode.torch_cases(torch)


NAMES = [
    "rope numpy [1,32,1,128]",
    "apply_rope numpy [1,32,1,128]",
    "rope_cos_sin numpy [1] x 64, next position",
    "rope_cos_sin numpy [1] x 64, same position",
    "t5_bias numpy 16 heads, 1 x 512",
    "relative_bias t5 numpy 16 heads, 1 x 512",
    "alibi_bias numpy 16 heads, 1 x 512",
    "xpos_scale numpy [1] x 128, one position",
    "kerple_bias numpy 16 heads, 1 x 512",
    "HF apply_rotary_pos_emb q [1,32,1,128] + k [1,8,1,128]",
    "HFRotaryEmbedding one position",
    "HF apply q + k, 4 positions, [b,s,h,d] views",
    "MultimodalHFRotaryEmbedding one position vs Qwen2-VL",
    "rope torch [1,32,1,128]",
    "apply_rope torch [1,32,1,128]",
    "rope_cos_sin torch [1,1] x 64",
    "T5RelativeBias 16 heads, 1 x 512",
    "t5_bias torch 16 heads, 1 x 512",
    "relative_bias t5 torch 16 heads, 1 x 512",
    "ALiBi 16 heads, 1 x 512",
    "alibi_bias torch 16 heads, 1 x 512",
    "rope numpy [1,32,1,128], positions [511]",
    "rope numpy [1,32,1,128], positions [[511]]",
    "rope numpy [1,32,1,128], offset np.int64(511)",
    "t5_bias numpy 16 heads, 1 x 512, positions",
    "relative_bias t5 numpy 16 heads, 1 x 512, positions",
    "kerple_bias numpy 16 heads, 1 x 512, positions",
    "alibi_bias numpy 16 heads, 1 x 512, positions",
    "t5_bias numpy 16 heads, 1 x 512, offset np.array(511)",
    "relative_bias shaw numpy 16 heads, 1 x 512",
    "relative_bias deberta torch 16 heads, 1 x 512",
    "alibi_bias numpy 16 heads, 1 x 512, offset np.int64(511)",
    "rope torch [1,32,1,128], position_ids [[511]]",
    "rope torch [1,32,1,128], offset tensor(511)",
    "rope torch [4,32,1,128], position_ids of 4 rows",
    "rope torch [4,32,1,128], one offset a row",
    "T5RelativeBias 16 heads, 1 x 512, offset tensor(511)",
    "ALiBi 16 heads, 1 x 512, offset tensor(511)",
    "T5RelativeBias 16 heads, 1 x 512, positions",
    "t5_bias torch 16 heads, 1 x 512, positions",
    "ALiBi 16 heads, 1 x 512, positions",
    "alibi_bias torch 16 heads, 1 x 512, positions",
    "T5RelativeBias 16 heads, 1 x 512, grad",
    "T5RelativeBias 16 heads, 1 x 512, positions, grad",
]


class DecodeStep:
    params = [NAMES]
    param_names = ["call"]
    timeout = 120
    rounds = 2
    repeat = (5, 20, 10.0)
    min_run_count = 5

    def setup(self, name):
        self._restore = []  # undone by teardown, which asv runs after a skipped setup too
        found = {case.name: case for case in _cases(name)}
        self.case = found[name]
        if "numpy" not in name:
            import torch

            threads = torch.get_num_threads()
            torch.set_num_threads(min(2, threads))
            self._restore.append(lambda: torch.set_num_threads(threads))
            grad = torch.no_grad()
            grad.__enter__()
            self._restore.append(lambda: grad.__exit__(None, None, None))
        self.case.posenc()
        self.case.framework()

    def teardown(self, name):
        for undo in reversed(getattr(self, "_restore", [])):
            undo()

    def time_posenc(self, name):
        step = self.case.posenc
        for _ in range(CALLS):
            step()

    def track_ratio(self, name):
        return floor_ratio(self.case.posenc, self.case.framework, calls=20)

    track_ratio.unit = "x framework time"
    track_ratio.rounds = 1  # one number, from its own rounds in turns


class Generate:
    """patch_hf: patched over unpatched time of ``generate()`` (32 tokens after 64) and of a 1024-token prefill."""

    params = [["float32", "bfloat16"], ["generate", "prefill"]]
    param_names = ["dtype", "call"]
    timeout = 900

    def setup_cache(self):
        """The ratios, or ``None`` without torch and transformers (``setup`` skips then)."""
        if importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None:
            return None
        from posenc._bench_generate import ratios

        return {dtype: ratios(dtype, repeat=3)[0] for dtype in ("float32", "bfloat16")}

    def setup(self, found, dtype, call):
        if found is None:
            require("torch")
            require("transformers")

    def track_patched_over_unpatched(self, found, dtype, call):
        ours, theirs, _ = found[dtype][call]
        return ours[0] / theirs[0]

    track_patched_over_unpatched.unit = "x unpatched time"
