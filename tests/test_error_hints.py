"""Errors that say what to do: each common mistake of the rotary and absolute families gets
a message that names the argument and the fix."""

from __future__ import annotations

import numpy as np
import pytest

import posenc as pe

Q = np.ones((2, 3, 5, 8))  # [batch, heads, seq, dim]


def test_a_number_for_positions_points_to_offset():
    with pytest.raises(TypeError, match=r"positions must be an array.*pass offset=5"):
        pe.rope(Q, 5)
    with pytest.raises(TypeError, match=r"pass offset=2\.0"):
        pe.rope(Q, 2.0)


@pytest.mark.parametrize("call", [lambda s: pe.rope(Q, scaling=s), lambda s: pe.rope_frequencies(8, scaling=s)])
def test_a_hugging_face_dict_points_to_from_hf_and_lists_every_class(call):
    with pytest.raises(TypeError, match=r"got dict; .*pe\.scaling\.from_hf") as info:
        call({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32})
    for name in ("Linear", "NTK", "DynamicNTK", "YaRN", "LongRoPE", "Llama3", "Proportional"):
        assert name in str(info.value)


def test_a_from_hf_result_points_to_its_scaling():
    read = pe.scaling.from_hf({"rope_type": "linear", "factor": 4.0}, head_dim=8)
    with pytest.raises(TypeError, match=r"got HFRope; pass its \.scaling"):
        pe.rope(Q, scaling=read)
    np.testing.assert_array_equal(pe.rope(Q, scaling=read.scaling), pe.rope(Q, np.arange(5) / 4.0))


def test_a_dtype_of_another_library_points_to_xp():
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match=r"got torch\.float16: it is a torch dtype; pass xp=torch"):
        pe.sinusoidal(8, 4, dtype=torch.float16)
    assert pe.sinusoidal(8, 4, dtype=torch.float16, xp=torch).dtype == torch.float16
    with pytest.raises(TypeError, match="dtype must be a real floating dtype"):
        pe.sinusoidal(8, 4, dtype=np.int32)


def test_positions_that_do_not_align_point_to_seq_axis_and_their_shape():
    with pytest.raises(ValueError, match=r"pass seq_axis.*position_ids\[:, None\]"):
        pe.rope(Q, np.zeros((3, 5), dtype=int))  # [heads, seq]: leading axes are batch axes


def test_scaling_lists_public_names_only():
    assert dir(pe.scaling) == sorted(pe.scaling.__all__)
    for private in ("np", "math", "warnings", "check", "dataclass"):
        assert private not in dir(pe.scaling)
