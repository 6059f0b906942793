"""A decode step: every call of issue 18's table beside the framework's own code, and patch_hf.

The cases are ``posenc._bench_decode``'s (``posenc bench`` prints the same table): one new
token after a cache of 511, heads ``[1, 32, 1, 128]`` and ``[1, 8, 1, 128]``, biases of 16
heads over 512 keys. ``time_posenc`` and ``time_framework`` time each side alone;
``track_ratio`` times them interleaved (best round of 200 calls each) and reports posenc's
time over the framework's (lower is better; the goal is 1.5, 1.0 for T5). ``Generate``
tracks patched over unpatched ``generate()`` and prefill of the LLaMA-like model
(``posenc._bench_generate``), float32 and bfloat16, in one run.
"""

from __future__ import annotations

from .common import require


def _cases():
    from posenc import _bench_decode

    found = _bench_decode.numpy_cases()
    try:
        torch = require("torch")
        require("transformers")
    except NotImplementedError:
        return found
    return found + _bench_decode.torch_cases(torch)


NAMES = [
    "rope numpy [1,32,1,128]",
    "apply_rope numpy [1,32,1,128]",
    "rope_cos_sin numpy [1] x 64, next position",
    "rope_cos_sin numpy [1] x 64, same position",
    "t5_bias numpy 16 heads, 1 x 512",
    "relative_bias t5 numpy 16 heads, 1 x 512",
    "alibi_bias numpy 16 heads, 1 x 512",
    "HF apply_rotary_pos_emb q [1,32,1,128] + k [1,8,1,128]",
    "HFRotaryEmbedding one position",
    "rope torch [1,32,1,128]",
    "apply_rope torch [1,32,1,128]",
    "rope_cos_sin torch [1,1] x 64",
    "T5RelativeBias 16 heads, 1 x 512",
    "t5_bias torch 16 heads, 1 x 512",
    "relative_bias t5 torch 16 heads, 1 x 512",
    "ALiBi 16 heads, 1 x 512",
    "alibi_bias torch 16 heads, 1 x 512",
]


class DecodeStep:
    params = [NAMES]
    param_names = ["call"]
    timeout = 120

    def setup(self, name):
        found = {case.name: case for case in _cases()}
        if name not in found:
            raise NotImplementedError(f"{name}: torch or transformers is not installed")
        self.case = found[name]
        self._threads = None
        if "numpy" not in name:
            import torch

            self._threads = torch.get_num_threads()
            torch.set_num_threads(min(2, self._threads))
            self._grad = torch.no_grad()
            self._grad.__enter__()
        self.case.posenc()
        self.case.framework()

    def teardown(self, name):
        if self._threads is not None:
            import torch

            self._grad.__exit__(None, None, None)
            torch.set_num_threads(self._threads)

    def time_posenc(self, name):
        self.case.posenc()

    def time_framework(self, name):
        self.case.framework()

    def track_ratio(self, name):
        from posenc._bench_decode import interleaved

        ours, theirs = interleaved(self.case, rounds=5, calls=200)
        return ours / theirs

    track_ratio.unit = "x framework time"


class Generate:
    """patch_hf: patched over unpatched time of ``generate()`` (32 tokens after 64) and of a 1024-token prefill."""

    params = [["float32", "bfloat16"], ["generate", "prefill"]]
    param_names = ["dtype", "call"]
    timeout = 900
    number = 1
    repeat = 1

    def setup_cache(self):
        require("torch")
        require("transformers")
        from posenc._bench_generate import ratios

        return {dtype: ratios(dtype, repeat=3)[0] for dtype in ("float32", "bfloat16")}

    def track_patched_over_unpatched(self, found, dtype, call):
        ours, theirs, _ = found[dtype][call]
        return ours[0] / theirs[0]

    track_patched_over_unpatched.unit = "x unpatched time"
