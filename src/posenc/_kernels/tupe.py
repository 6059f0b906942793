"""Registration of ``tupe_row_terms`` (TUPE's position terms of one offset per batch row).

Its one kernel is ``posenc.torch._ops``'s custom op, for torch tensors while
``torch.compile`` traces (``relative.tupe`` calls the op there alone): one op for every
row, whose count stays symbolic; its forward runs the reference's loop over the rows.
"""

from __future__ import annotations

from .._dispatch import register
from ..relative import tupe  # noqa: F401  (registers the reference)
from . import _arrays

register("tupe_row_terms", "tupe_row_terms.torch_autograd", accepts=lambda a: _arrays.to_custom_op([a["p"]]), loader="posenc.torch._ops:tupe_row_terms")
