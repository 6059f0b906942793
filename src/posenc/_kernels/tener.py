"""Registration of ``tener_row_terms`` (TENER's position scores of one offset per batch row).

Its one kernel is ``posenc.torch._ops``'s custom op, for torch tensors while
``torch.compile`` traces (``relative.xl`` calls the op there alone): one op for every row,
whose count stays symbolic; its forward runs the reference's loop over the rows.
"""

from __future__ import annotations

from .._dispatch import register
from ..relative import xl  # noqa: F401  (registers the reference)
from . import _arrays

register("tener_row_terms", "tener_row_terms.torch_autograd", accepts=lambda a: _arrays.to_custom_op([a["queries"]]), loader="posenc.torch._ops:tener_row_terms")
