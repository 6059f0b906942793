"""``patch_hf``: recognise a transformers model's positional parts, check posenc's replacements, swap them.

A part is recognised by what it is, not by the model's name:

* a **rotary module**: a submodule with a ``config`` and ``rope_type`` or an ``inv_freq``
  buffer, called ``forward(x, position_ids) -> (cos, sin)``; replaced by
  :class:`~posenc.torch.hf.HFRotaryEmbedding` on the same config (its tables in the
  interleaved order for Cohere's modules, one entry per pair for GPT-OSS's, one complex
  ``cos + i sin`` table for DeepSeek-V2's and Llama 4's); a multimodal one (``mrope_section``,
  position ids ``[3, batch, seq]``) by :class:`~posenc.torch.hf.MultimodalHFRotaryEmbedding`
  (interleaved tables for GLM-4V's), checked on ids that differ per axis;
* the **apply function** an attention layer calls on it: a global of the layer's ``forward``
  named ``apply_*rot*`` taking ``(q, k, cos, sin, ...)``; replaced by posenc's
  :func:`posenc.apply_rope` in the layout that reproduces it ("half"; "interleaved" as
  GLM-style functions make it from the same ``cos``/``sin``; interleaved ``cos``/``sin`` as
  Cohere's modules give them; interleaved pairs stored back in the half order, DeepSeek's
  latent attention; half pairs from one ``cos``/``sin`` per pair, GPT-OSS; half pairs
  turned by ``-angle``, NanoChat), partial rotary included; the complex ``apply(xq, xk,
  freqs_cis)`` of DeepSeek-V2 and Llama 4, GPT-J's ``apply(tensor, sin, cos)`` and
  RoFormer's static ``apply_rotary_position_embeddings(sinusoidal_pos, q, k[, v])`` too
  (the last two on their own tables);
* a **T5 relative bias**: a layer holding a ``relative_attention_bias`` embedding with
  ``compute_bias`` (T5's signature, or LongT5's ``compute_bias(block_length)`` and its
  transient-global ``compute_side_bias``); replaced by :func:`posenc.t5_bias` of the
  layer's own table, read from the layer on every call;
* an **ALiBi builder**: a ``build_*alibi*`` method or global a module's ``forward`` calls,
  ``(attention_mask, num_heads, dtype)`` (BLOOM; Falcon with ``alibi=True``, whose slopes are
  rounded to bfloat16) or ``(num_heads, sequence_length, ...)`` (MPT); replaced by
  :func:`posenc.alibi_bias` of the key positions.

Every replacement is run beside the model's own code on probe inputs, in the model's dtype
and on its device, before anything is swapped. All parts must match within the rounding of
that dtype, or nothing is swapped and a ``ValueError`` names each part that differs and by
how much: a model is patched entirely or left untouched, never silently different.
"""

from __future__ import annotations

import copy
import functools
import inspect
import itertools
import re
import sys
import types
import weakref

import torch
from torch import nn

import posenc as pe
from posenc.rotary.apply import rotate_pair


_APPLY_NAME = re.compile(r"^apply_\w*rot", re.IGNORECASE)
PATCHED_ATTRIBUTE = "posenc_patched"  # what patch_hf swapped, recorded on the model


class _Refusal(Exception):
    """A recognised part whose replacement cannot be checked or does not match (the message says which)."""


def patch(model):
    """Recognise, check and swap every positional part of ``model`` (the body of ``patch_hf``)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a transformers model (a torch.nn.Module), got {type(model).__name__}")
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "model_type"):
        raise TypeError(f"model must be a transformers model with a config (config.model_type), got {type(model).__name__} without one")
    if getattr(model, PATCHED_ATTRIBUTE, None) or any(_is_ours(m) for m in model.modules()):
        raise ValueError(f"{type(model).__name__} is already patched by patch_hf; patch the original model once")
    rotary, swaps, refusals = _checked_parts(model)
    if refusals:
        raise ValueError(
            f"patch_hf left {type(model).__name__} (model_type={config.model_type!r}) unpatched: " + "; ".join(refusals) + _language_model_hint(model)
        )
    if not swaps:
        from .hf import SUPPORTED

        raise ValueError(
            f"{type(model).__name__} (model_type={config.model_type!r}) has no positional part patch_hf recognises: "
            "no rotary module (forward(x, position_ids) -> (cos, sin) with rope_type or inv_freq), no attention layer calling "
            "apply_*rotary*, no relative_attention_bias with compute_bias, no build_*alibi* builder "
            f"(architectures verified in posenc's tests: {', '.join(SUPPORTED)})"
        )
    for name, ours in rotary.items():  # the state transformers' module has, not the probes'
        (ours.rotary if isinstance(ours, _ReorderedHFRotaryEmbedding) else ours).take_state(model.get_submodule(name))
    done = []
    for swap, description in swaps:
        swap()
        done.extend([description] if isinstance(description, str) else description)
    # a plain attribute (not nn.Module's __setattr__): a tuple of what was swapped
    object.__setattr__(model, PATCHED_ATTRIBUTE, tuple(done))
    return model


def _checked_parts(model):
    """``(rotary, swaps, refusals)``: every positional part of ``model`` recognised and checked, nothing swapped yet."""
    dtype, device = _probe_dtype_device(model)
    swaps, refusals = [], []
    rotary = _rotary_parts(model, dtype, device, swaps, refusals)
    _apply_parts(model, rotary, dtype, device, swaps, refusals)
    _sinusoidal_apply_parts(model, dtype, device, swaps, refusals)
    _t5_parts(model, swaps, refusals)
    _alibi_parts(model, device, swaps, refusals)
    return rotary, swaps, refusals


def _language_model_hint(model):
    """For a refused model holding a ``language_model`` (a vision-language model, whose vision
    encoder's rotary parts posenc does not reproduce): that this one passes every check, if
    it does, and how to patch it alone; else nothing."""
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] != "language_model" or not hasattr(getattr(module, "config", None), "model_type"):
            continue
        try:
            _, swaps, refusals = _checked_parts(module)
        except (TypeError, ValueError):
            return ""
        if swaps and not refusals:
            return (
                f". Its language model {name} ({type(module).__name__}) passes every check: "
                f"patch_hf(model.get_submodule({name!r})) patches it alone, the rest keeping its own code"
            )
        return ""
    return ""


def _is_ours(module):
    from .hf import HFRotaryEmbedding

    ours = (HFRotaryEmbedding, InterleavedHFRotaryEmbedding, UndoubledHFRotaryEmbedding)  # (the others subclass these)
    return isinstance(module, ours) or any(getattr(vars(module).get(slot), "__posenc__", False) for slot in ("forward", "_old_forward"))


def _probe_dtype_device(model):
    tensor = next((p for p in model.parameters() if p.is_floating_point()), None)
    if tensor is None:
        tensor = next((b for b in model.buffers() if b.is_floating_point()), None)
    if tensor is None:
        raise ValueError(f"{type(model).__name__} has no floating-point parameter to take the probe's dtype and device from")
    if tensor.device.type == "meta":
        raise ValueError(f"{type(model).__name__} is on the meta device: its parts cannot be run to check them; load its weights first")
    if tensor.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        raise TypeError(f"patch_hf checks models in float16, bfloat16, float32 or float64, got {tensor.dtype}")
    return tensor.dtype, tensor.device


def _eps(dtype):
    return torch.finfo(dtype).eps


# --- rotary modules -------------------------------------------------------------------------


def _looks_rotary(module):
    if _is_ours(module) or not hasattr(module, "config"):
        return False
    return hasattr(module, "rope_type") or isinstance(getattr(module, "inv_freq", None), torch.Tensor)


def _rotary_parts(model, dtype, device, swaps, refusals):
    """Check an ``HFRotaryEmbedding`` against each rotary module; returns ``{name: replacement}``."""
    found = {}
    for name, module in model.named_modules():
        if not _looks_rotary(module):
            continue
        label = f"rotary module {name} ({type(module).__name__})"
        try:
            ours = _checked_rotary(module, dtype, device)
        except (_Refusal, ValueError, TypeError, NotImplementedError) as why:
            refusals.append(f"{label}: {why}")
            continue
        for key, value in vars(module).items():  # plain settings the model may read (layer_types, rope_type, ...)
            if not key.startswith("_") and not hasattr(ours, key) and not isinstance(value, (torch.Tensor, nn.Module)):
                setattr(ours, key, value)
        if device.type == "cpu":  # the rows a compiled decode step gathers its tables from
            ours.keep_rows_for_compile(dtype)
        found[name] = ours
        swaps.append((_replacer(model, name, ours), f"{name}: {type(ours).__name__}"))
    return found


def _checked_rotary(module, dtype, device):
    """The first of posenc's rotary modules whose ``(cos, sin)`` match ``module``'s (the first kind's refusal if none):
    the multimodal ones for a module with M-RoPE sections, the text ones otherwise."""
    from .hf import HFRotaryEmbedding, InterleavedMultimodalHFRotaryEmbedding, MultimodalHFRotaryEmbedding

    first = None
    if _mrope_keys(module):
        kinds = (MultimodalHFRotaryEmbedding, InterleavedMultimodalHFRotaryEmbedding)
    else:
        kinds = (HFRotaryEmbedding, InterleavedHFRotaryEmbedding, UndoubledHFRotaryEmbedding, ComplexHFRotaryEmbedding)
    for kind in kinds:
        ours = kind(module.config, device=device, transformers_state=True)
        try:
            _check_rotary(module, ours, dtype, device)
            return ours
        except _Refusal as why:
            first = first or why
    raise first


class _ReorderedHFRotaryEmbedding(nn.Module):
    """:class:`~posenc.torch.hf.HFRotaryEmbedding`'s ``(cos, sin)``, handed on in another order (``_order``)."""

    def __init__(self, config, *, device=None, transformers_state=False):
        from .hf import HFRotaryEmbedding

        super().__init__()
        self.rotary = HFRotaryEmbedding(config, device=device, transformers_state=transformers_state)
        self.config, self._rope, self.attention_scaling = config, self.rotary._rope, self.rotary.attention_scaling

    def keep_rows_for_compile(self, dtype):
        self.rotary.keep_rows_for_compile(dtype)

    def forward(self, x, position_ids, layer_type=None):
        cos, sin = self.rotary(x, position_ids, layer_type)
        half = cos.shape[-1] // 2
        return self._order(cos[..., :half]), self._order(sin[..., :half])


class InterleavedHFRotaryEmbedding(_ReorderedHFRotaryEmbedding):
    """:class:`~posenc.torch.hf.HFRotaryEmbedding` with ``cos``/``sin`` in the interleaved order.

    ``[c_0, c_0, c_1, c_1, ...]`` where transformers' LLaMA order is ``[c_0, c_1, ..., c_0, c_1, ...]``:
    the order of Cohere's rotary modules, whose apply function pairs ``(x[2i], x[2i+1])``.
    """

    @staticmethod
    def _order(half_table):
        return half_table.repeat_interleave(2, -1)


class UndoubledHFRotaryEmbedding(_ReorderedHFRotaryEmbedding):
    """:class:`~posenc.torch.hf.HFRotaryEmbedding` with one ``cos``/``sin`` per pair, ``[..., r/2]``.

    ``[c_0, c_1, ..., c_{r/2-1}]``, not repeated: the tables of GPT-OSS's rotary modules, whose
    apply function rotates ``(x[i], x[i + r/2])`` by entry ``i``.
    """

    @staticmethod
    def _order(half_table):
        return half_table


class ComplexHFRotaryEmbedding(UndoubledHFRotaryEmbedding):
    """:class:`~posenc.torch.hf.HFRotaryEmbedding` as one complex table ``cos + i sin``, ``[..., r/2]`` complex64.

    DeepSeek-V2's rotary modules return it (``freqs_cis``); its apply function multiplies the
    pairs ``x[2i] + i x[2i+1]`` by it.
    """

    def forward(self, x, position_ids, layer_type=None):
        cos, sin = super().forward(torch.zeros(1, dtype=torch.float32, device=x.device), position_ids, layer_type)
        return torch.complex(cos, sin)


def _kind_of(result):
    return "one complex table" if isinstance(result, torch.Tensor) else "a (cos, sin) pair"


def _cos_sin_pair(result):
    """``(cos, sin)`` of a rotary module's result: the pair, or the parts of a complex ``cos + i sin``; None if neither."""
    if isinstance(result, torch.Tensor) and result.is_complex():
        return result.real, result.imag
    if isinstance(result, tuple) and len(result) == 2 and all(isinstance(t, torch.Tensor) for t in result):
        return result
    return None


def _probe_positions(config, device):
    """Two calls' position ids: a short batch, and one past ``max_position_embeddings`` (switches)."""
    limit = int(getattr(config, "max_position_embeddings", 0) or 0) or 2048
    short = torch.stack([torch.arange(12), torch.arange(12) + 3]).to(device)
    long = torch.arange(max(limit - 6, 0), limit + 10, device=device)[None].expand(2, -1)
    return short, long


def _mrope_keys(module):
    """The M-RoPE keys (``mrope_section``, ...) of a rotary module's rope parameters or attributes."""
    params = getattr(module.config, "rope_parameters", None) or {}
    nested = [v for v in params.values() if isinstance(v, dict)] if isinstance(params, dict) else []
    return sorted({k for d in [params, *nested, vars(module)] if isinstance(d, dict) for k in d if k.startswith("mrope")})


def _check_rotary(theirs, ours, dtype, device):
    from .hf import MultimodalHFRotaryEmbedding

    multimodal = isinstance(ours, MultimodalHFRotaryEmbedding)  # (the kind _checked_rotary tries on a module with M-RoPE sections)
    theirs = copy.deepcopy(theirs)  # a stateful (dynamic) module must not remember the probe
    angle_eps = _unround_frequencies(theirs, ours)
    layer_types = pe.scaling.nested_layer_types(theirs.config) or [None]
    x = torch.zeros(1, dtype=dtype, device=device)
    probes = _probe_positions(theirs.config, device)
    if multimodal:  # an image's ids: every axis its own (the first one's the largest, as the length reads it)
        probes = [torch.stack([p, p // 2 + 1, p % 7]) for p in probes]
    for position_ids in probes:
        for layer_type in layer_types:
            args = (x, position_ids) if layer_type is None else (x, position_ids, layer_type)
            try:
                with torch.no_grad():
                    want = theirs(*args)
            except Exception as error:  # noqa: BLE001  (the model's own code: any failure means "not this kind of part")
                raise _Refusal(f"its forward(x, position_ids) does not run ({type(error).__name__}: {_short(error)})") from None
            got = ours(*args)
            if isinstance(want, torch.Tensor) != isinstance(got, torch.Tensor):
                raise _Refusal(f"it returns {_kind_of(want)}, posenc's {_kind_of(got)}")
            want, got = _cos_sin_pair(want), _cos_sin_pair(got)
            if want is None:
                raise _Refusal("its forward(x, position_ids) does not return (cos, sin) or complex cos + i sin")
            for part, w, g in zip(("cos", "sin"), want, got):
                if w.shape != g.shape:
                    raise _Refusal(f"{part} has shape {tuple(w.shape)}, posenc's {tuple(g.shape)}")
                # transformers forms the angle p * theta in float32 (from an inv_freq buffer that
                # model.to(bfloat16) may have rounded to 16 bits); then both round to dtype
                scale = max(1.0, float(w.abs().max()))
                tolerance = scale * (8 * angle_eps * float(position_ids.max() + 1) + 2 * _eps(dtype))
                diff = float((w.double() - g.double()).abs().max())
                if not diff <= tolerance:
                    where = "" if layer_type is None else f" for {layer_type}"
                    raise _Refusal(f"{part}{where} differs from posenc's by {diff:.3g} (tolerance {tolerance:.3g})")


def _unround_frequencies(theirs, ours):
    """Set the frequency buffers of the probe's copy ``theirs`` that ``model.to(bfloat16)`` (or
    float16) rounded (``inv_freq``, ``original_inv_freq``, or one per layer type as Gemma 3's)
    to posenc's frequencies in float32, as transformers built them, where each is posenc's to
    within its dtype's rounding (``|buffer - f| <= eps (|f| + tiny)``); a rounded buffer that is
    not is a refusal. The check then compares the formula at float32's tolerance: rounded angles
    would need one so wide (``8 eps (p + 1)`` up to position ``p``: 0.94 at 14 in bfloat16) that other
    frequencies would pass. Returns the eps of the angles: float32's, or that of a rounded
    frequency buffer posenc cannot tell the frequencies of."""
    inner = getattr(ours, "rotary", ours)  # (a reordered module's HFRotaryEmbedding)
    angle_eps, checked_originals = _eps(torch.float32), set()
    buffers = [(name, b) for name, b in theirs.named_buffers() if name.endswith("inv_freq") and b.is_floating_point()]
    for name, buffer in sorted(buffers, key=lambda item: "original_inv_freq" not in item[0]):  # (originals first)
        if _eps(buffer.dtype) <= _eps(torch.float32):
            continue
        key = name.removesuffix("inv_freq").removesuffix("original_").removesuffix("_") or None
        known = inner._fixed.get(key) or inner._unscaled.get(key)
        if "." in name or known is None or len(known[0]) != buffer.numel():
            angle_eps = max(angle_eps, _eps(buffer.dtype))
            continue
        exact = torch.tensor(known[0], dtype=torch.float64, device=buffer.device).reshape(buffer.shape)
        info = torch.finfo(buffer.dtype)
        diff, rounding = (buffer.double() - exact).abs(), info.eps * (exact.abs() + info.tiny)
        # dynamic NTK's or LongRoPE's current frequencies are those of the last call's length (its
        # original ones checked): the module's next call recomputes them or resets them to those
        current = key in inner._unscaled and key in checked_originals and not name.endswith("original_inv_freq")
        if not current and bool((diff > rounding).any()):
            worst = int((diff - rounding).argmax())
            raise _Refusal(
                f"its {name} ({buffer.dtype}) differs from posenc's frequencies by {float(diff.flatten()[worst]):.3g} "
                f"(rounding {float(rounding.flatten()[worst]):.3g})"
            )
        theirs._buffers[name] = exact.float()
        if name.endswith("original_inv_freq"):
            checked_originals.add(key)
    return angle_eps


# --- apply functions ------------------------------------------------------------------------


def _forward_code(module):
    """The function whose code is ``type(module).forward``: the forward itself, or the function
    its decorators wrap (``__wrapped__``, set by ``functools.wraps``: transformers 5.24 wraps
    attention forwards in ``deprecate_kwarg``); None if it is not a Python function."""
    fn = getattr(type(module), "forward", None)
    while isinstance(getattr(fn, "__wrapped__", None), types.FunctionType):
        fn = fn.__wrapped__
    return fn if isinstance(fn, types.FunctionType) else None


def _apply_globals(module):
    """``{global name: function}`` of the ``apply_*rot*`` functions ``module.forward`` calls."""
    fn = _forward_code(module)
    if fn is None:
        return {}
    names = {n for n in fn.__code__.co_names if _APPLY_NAME.match(n)}
    return {n: fn.__globals__[n] for n in names if callable(fn.__globals__.get(n))}


def _apply_parts(model, rotary, dtype, device, swaps, refusals):
    replacements = {}  # original function -> checked replacement (or the refusal)
    users = []
    for name, module in model.named_modules():
        used = _apply_globals(module)
        if not used:
            continue
        refusal = _rebinding_refusal(name, module, sorted(used))
        if refusal is not None:
            refusals.append(refusal)
            continue
        users.append((name, module, used))
        for fn in used.values():
            if fn not in replacements:
                replacements[fn] = _replacement_for(fn, rotary, model.config, dtype, device)
    for fn, found in replacements.items():
        if isinstance(found, str):
            refusals.append(f"apply function {fn.__module__}.{fn.__name__}: {found}")
    if any(isinstance(found, str) for found in replacements.values()):
        return
    for name, module, used in users:
        mapping = {n: replacements[fn] for n, fn in used.items()}
        what = ", ".join(f"{n}: apply_rope ({LAYOUTS[replacements[fn]]})" for n, fn in sorted(used.items()))
        swaps.append((_rebinder(module, mapping), f"{name}: {what}"))


def _replacement_for(fn, rotary, config, dtype, device):
    """A checked posenc replacement of the apply function ``fn``, or why there is none (a str)."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return "its signature cannot be read"
    params = list(signature.parameters)
    if params == ["tensor", "sin", "cos"]:
        return _table_apply_for(fn, dtype, device)
    if params == ["xq", "xk", "freqs_cis"]:
        return _complex_apply_for(fn, dtype, device)
    if params[:3] == ["x", "cos", "sin"] and params[3:] in ([], ["unsqueeze_dim"]):
        return _single_apply_for(fn, signature, rotary, config, dtype, device)
    if params[:4] != ["q", "k", "cos", "sin"]:
        return f"takes ({', '.join(params)}), not (q, k, cos, sin, ...)"
    optional = [p for p in params[:4] if signature.parameters[p].default is not inspect.Parameter.empty]
    if optional:  # (Qwen4-Exp's indexer calls apply_rotary_pos_emb(q, cos=cos, sin=sin), a query alone)
        return f"takes ({', '.join(params)}) with defaults for {', '.join(optional)}: calls that leave them out are not reproduced"
    extra = params[4:]
    required = [p for p in extra if signature.parameters[p].default is inspect.Parameter.empty]
    if required or not set(extra) <= {"position_ids", "unsqueeze_dim"}:
        return f"takes ({', '.join(params)}): arguments posenc does not reproduce ({', '.join(p for p in extra if p not in ('position_ids', 'unsqueeze_dim'))})"
    if not rotary:
        return "the model has no rotary module posenc replaced, so no (cos, sin) to check it with"
    unsqueeze_default = signature.parameters["unsqueeze_dim"].default if "unsqueeze_dim" in extra else 1
    probes = _apply_probes(next(iter(rotary.values())), config, dtype, device, "unsqueeze_dim" in extra)
    make = lambda layout: _make_apply(layout, extra, unsqueeze_default)  # noqa: E731
    return _reproducing(fn, make, probes, dtype, "q [batch, heads, seq, d], k, cos, sin [batch, seq, r]")


def _reproducing(fn, make, probes, dtype, shapes, outputs=lambda f: f):
    """The first ``make(layout)`` of the apply layouts that gives ``fn``'s results on ``probes``
    (compared through ``outputs``: a function returning a tuple of tensors), or why none does."""
    differences = []
    for layout in ("half", "interleaved", "interleaved cos/sin", "interleaved in, half out", "half, one cos/sin per pair", "half, by -angle"):
        candidate = make(layout)
        diff = _compare_apply(outputs(fn), outputs(candidate), probes, dtype)
        if diff is None:
            return f"it does not run on ({shapes}) probes"
        if diff[0] <= diff[1]:
            return candidate
        differences.append(f"{layout} layout differs by {diff[0]:.3g} (tolerance {diff[1]:.3g})")
    return "no posenc layout reproduces it: " + ", ".join(differences)


def _single_apply_for(fn, signature, rotary, config, dtype, device):
    """A checked replacement of ``apply(x, cos, sin[, unsqueeze_dim])``, one tensor a call (Gemma 4), or why there is none."""
    if not rotary:
        return "the model has no rotary module posenc replaced, so no (cos, sin) to check it with"
    has_unsqueeze = "unsqueeze_dim" in signature.parameters
    unsqueeze_default = signature.parameters["unsqueeze_dim"].default if has_unsqueeze else 1
    probes = [((q, cos, sin), kwargs) for (q, _, cos, sin), kwargs in _apply_probes(next(iter(rotary.values())), config, dtype, device, has_unsqueeze)]
    make = lambda layout: _make_single_apply(layout, unsqueeze_default)  # noqa: E731
    one = lambda f: lambda *a, **k: (f(*a, **k),)  # noqa: E731
    return _reproducing(fn, make, probes, dtype, "x [batch, heads, seq, d], cos, sin [batch, seq, r]", one)


def _make_single_apply(layout, unsqueeze_default):
    """posenc's ``apply_rotary_pos_emb(x, cos, sin, unsqueeze_dim)``: one tensor turned in ``layout``."""
    if layout in ("half", "interleaved cos/sin"):
        own = "half" if layout == "half" else "interleaved"

        def rotate(x, cos, sin):
            return pe.apply_rope(x, cos, sin, layout=own)

    else:
        rotate = _rotation(layout)

    def apply_rotary_pos_emb(x, cos, sin, unsqueeze_dim=unsqueeze_default):
        return rotate(x, cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim))

    LAYOUTS[apply_rotary_pos_emb] = f"{layout}, one tensor"
    return _recipe(apply_rotary_pos_emb, _make_single_apply, layout, unsqueeze_default)


def _table_apply_for(fn, dtype, device):
    """GPT-J's form, ``apply(tensor [batch, seq, heads, r], sin, cos [batch, seq, r/2])``: interleaved pairs.

    The angles stay the model's own (its ``embed_positions`` table); the rotation goes through
    posenc (``_table_apply``).
    """
    generator = torch.Generator().manual_seed(0)
    angles = torch.arange(9.0)[:, None] * 100.0 ** (-torch.arange(0, 8, 2) / 8)
    sin, cos = (torch.stack([f(angles), f(angles + 0.5)]).to(dtype=dtype, device=device) for f in (torch.sin, torch.cos))
    x = torch.randn(2, 9, 3, 8, generator=generator).to(dtype=dtype, device=device)
    diff = _compare_apply(lambda *a: (fn(*a),), lambda *a: (_table_apply(*a),), [((x, sin, cos), {})], dtype)
    if diff is None:
        return "it does not run on (tensor [batch, seq, heads, r], sin, cos [batch, seq, r/2]) probes"
    if not diff[0] <= diff[1]:
        return f"the interleaved layout differs by {diff[0]:.3g} (tolerance {diff[1]:.3g})"
    LAYOUTS[_table_apply] = "interleaved, the model's own sin/cos table"
    return _table_apply


def _table_apply(tensor, sin, cos):
    """posenc's rotation of ``tensor`` by GPT-J's ``sin``/``cos`` ``[batch, seq, r/2]``: pairs ``(x[2i], x[2i+1])``."""
    cos = cos[:, :, None, :].repeat_interleave(2, 3)
    sin = sin[:, :, None, :].repeat_interleave(2, 3)
    return pe.apply_rope(tensor, cos, sin, layout="interleaved")


def _complex_apply_for(fn, dtype, device):
    """The complex form, ``apply(xq, xk, freqs_cis [batch, seq, r/2] complex)``: interleaved pairs times ``cos + i sin``.

    The heads are axis 1 (DeepSeek-V2, ``[batch, heads, seq, r]``) or axis 2 (Llama 4,
    ``[batch, seq, heads, r]``): each is tried on probes of its own layout.
    """
    generator = torch.Generator().manual_seed(0)
    angles = (torch.arange(9.0)[:, None] * 100.0 ** (-torch.arange(0, 8, 2) / 8))[None] + torch.tensor([0.0, 0.5])[:, None, None]
    freqs_cis = torch.polar(torch.ones_like(angles), angles).to(device)
    differences = []
    for heads_axis in (1, 2):
        candidate = _complex_apply(heads_axis)
        shape = [2, 9, 8]
        shape.insert(heads_axis, 3)
        xq = torch.randn(*shape, generator=generator).to(dtype=dtype, device=device)
        xk = torch.randn(*shape, generator=generator).to(dtype=dtype, device=device)
        diff = _compare_apply(fn, candidate, [((xq, xk, freqs_cis), {})], dtype)
        if diff is None:
            continue
        if diff[0] <= diff[1]:
            return candidate
        differences.append(f"heads on axis {heads_axis}: the interleaved layout differs by {diff[0]:.3g} (tolerance {diff[1]:.3g})")
    if not differences:
        return "it does not run on (xq [batch, heads, seq, r] or [batch, seq, heads, r], xk, freqs_cis [batch, seq, r/2] complex) probes"
    return "; ".join(differences)


def _complex_apply(heads_axis):
    def apply_rotary_emb(xq, xk, freqs_cis):
        """posenc's rotation of ``xq``, ``xk`` by ``freqs_cis = cos + i sin``: pairs ``(x[2i], x[2i+1])``."""
        cos = freqs_cis.real.unsqueeze(heads_axis).repeat_interleave(2, -1)
        sin = freqs_cis.imag.unsqueeze(heads_axis).repeat_interleave(2, -1)
        return tuple(pe.apply_rope(x, cos.to(x.dtype), sin.to(x.dtype), layout="interleaved") for x in (xq, xk))

    LAYOUTS[apply_rotary_emb] = f"interleaved, complex cos + i sin, heads on axis {heads_axis}"
    return _recipe(apply_rotary_emb, _complex_apply, heads_axis)


def _apply_probes(ours, config, dtype, device, has_unsqueeze):
    layer_type = next(iter(ours._rope))
    config = pe.scaling.layer_config(config, layer_type)  # (Gemma 4: a head size per layer type)
    heads = int(getattr(config, "num_attention_heads", 4) or 4)
    head_dim = getattr(config, "head_dim", None) or int(getattr(config, "hidden_size", 64)) // heads
    generator = torch.Generator().manual_seed(0)
    position_ids = torch.stack([torch.arange(9), torch.arange(9) + 4]).to(device)
    x = torch.zeros(1, dtype=dtype, device=device)
    cos, sin = ours(x, position_ids, layer_type) if layer_type is not None else ours(x, position_ids)
    rotary_dim = cos.shape[-1]
    probes = []
    for d in sorted({rotary_dim, int(head_dim)}):
        if d < rotary_dim:
            continue
        q = torch.randn(2, 3, 9, d, generator=generator).to(dtype=dtype, device=device)
        k = torch.randn(2, 2, 9, d, generator=generator).to(dtype=dtype, device=device)
        probes.append(((q, k, cos, sin), {}))
        if has_unsqueeze:
            probes.append(((q.transpose(1, 2), k.transpose(1, 2), cos, sin), {"unsqueeze_dim": 2}))
    return probes


def _compare_apply(theirs, ours, probes, dtype):
    """``(max difference, tolerance)`` over the probes ``theirs`` accepts, or None if it accepts none.

    In a 16-bit dtype the probes run in float32 too, at float32's tolerance (the difference
    and tolerance returned are those of the one that fails, if one does): the functions are
    the same code in every dtype, and a 16-bit tolerance (0.15 for bfloat16 probes) had let
    one that turns ``q`` 1.02 times too long pass."""
    found = _compare_apply_in(theirs, ours, probes, dtype)
    if found is None or _eps(dtype) <= _eps(torch.float32):
        return found
    widened = [(tuple(a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args), kwargs) for args, kwargs in probes]
    in_float32 = _compare_apply_in(theirs, ours, widened, torch.float32)
    return in_float32 if in_float32 is not None and not in_float32[0] <= in_float32[1] else found


def _compare_apply_in(theirs, ours, probes, dtype):
    worst, tolerance, ran = 0.0, 0.0, False
    for args, kwargs in probes:
        try:
            with torch.no_grad():
                want = theirs(*args, **kwargs)
        except Exception:  # noqa: BLE001  (a probe shape this function does not take: e.g. a full head for a rotary-only one)
            continue
        ran = True
        try:
            got = ours(*args, **kwargs)
        except ValueError:  # a layout whose tables do not fit these shapes (one cos/sin per pair, doubled, on full tables)
            return float("inf"), 0.0
        for w, g in zip(want, got):
            if w.shape != g.shape:
                return float("inf"), 0.0
            worst = max(worst, float((w.double() - g.double()).abs().max()))
            tolerance = max(tolerance, 4 * _eps(dtype) * float(w.abs().max()) + 4 * _eps(dtype))
    return (worst, tolerance) if ran else None


LAYOUTS = weakref.WeakKeyDictionary()  # replacement apply function -> the layout it was checked in


def _rotation(layout):
    """``rotate(x, cos, sin)``: one tensor turned by a model's ``cos``/``sin`` in ``layout``
    (one that is not ``pe.apply_rope``'s own), through ``pe.apply_rope``."""
    if layout == "interleaved in, half out":

        def rotate(x, cos, sin):  # DeepSeek's MLA: pairs (x[2i], x[2i+1]), results stored as [evens, odds]
            half = cos.shape[-1] // 2
            out = pe.apply_rope(x, cos[..., :half].repeat_interleave(2, -1), sin[..., :half].repeat_interleave(2, -1), layout="interleaved")
            return torch.cat([out[..., 0::2], out[..., 1::2]], dim=-1)

    elif layout == "half, by -angle":

        def rotate(x, cos, sin):  # NanoChat: rotate_half gives (x2, -x1), a turn by -angle
            return pe.apply_rope(x, cos, -sin)

    elif layout == "half, one cos/sin per pair":

        def rotate(x, cos, sin):  # GPT-OSS: cos/sin [..., r/2], entry i for the pair (x[i], x[i + r/2])
            return pe.apply_rope(x, torch.cat([cos, cos], dim=-1), torch.cat([sin, sin], dim=-1))

    else:

        def rotate(x, cos, sin):  # cos/sin [..., r] in the half order: c_0 .. c_{r/2-1} repeated
            half = cos.shape[-1] // 2
            return pe.apply_rope(x, cos[..., :half].repeat_interleave(2, -1), sin[..., :half].repeat_interleave(2, -1), layout="interleaved")

    return rotate


def _make_apply(layout, extra, unsqueeze_default):
    """posenc's ``apply_rotary_pos_emb`` with the parameters of the model's (``q, k, cos, sin`` + ``extra``)."""
    if layout == "half" and extra == ["unsqueeze_dim"] and unsqueeze_default == 1:
        from .hf import apply_rotary_pos_emb  # LLaMA's signature: posenc.torch.hf's own (its fast path)

        LAYOUTS[apply_rotary_pos_emb] = layout
        return apply_rotary_pos_emb
    if layout in ("half", "interleaved cos/sin"):
        # cos/sin in pe.apply_rope's own layouts: q and k in one CUDA launch where both reach the kernel.
        own = "half" if layout == "half" else "interleaved"

        def pair(q, k, cos, sin):
            return rotate_pair(q, k, cos, sin, layout=own)

    else:
        rotate = _rotation(layout)

        def pair(q, k, cos, sin):
            return rotate(q, cos, sin), rotate(k, cos, sin)

    if extra == ["position_ids", "unsqueeze_dim"]:

        def apply_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=unsqueeze_default):
            cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
            return pair(q, k, cos, sin)

    elif extra == ["position_ids"]:

        def apply_rotary_pos_emb(q, k, cos, sin, position_ids=None):
            cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
            return pair(q, k, cos, sin)

    else:

        def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=unsqueeze_default):
            cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
            return pair(q, k, cos, sin)

    LAYOUTS[apply_rotary_pos_emb] = layout
    return _recipe(apply_rotary_pos_emb, _make_apply, layout, extra, unsqueeze_default)


def _sinusoidal_apply_parts(model, dtype, device, swaps, refusals):
    """RoFormer's form: a static method ``apply_*rot*(sinusoidal_pos, query_layer, key_layer, value_layer=None)``
    an attention layer calls on ``self``, with ``sinusoidal_pos = [sin | cos]`` of its own table."""
    checked = {}
    for name, module in model.named_modules():
        forward = _forward_code(module)
        if forward is None:
            continue
        for method in sorted(n for n in forward.__code__.co_names if _APPLY_NAME.match(n)):
            fn = inspect.getattr_static(type(module), method, None)
            if not isinstance(fn, staticmethod):
                continue
            fn = fn.__func__
            if fn not in checked:
                checked[fn] = _sinusoidal_apply_for(fn, dtype, device)
            if isinstance(checked[fn], str):
                refusals.append(f"{name} ({type(module).__name__}).{method}: {checked[fn]}")
                continue
            swaps.append((_setter(module, method, checked[fn]), f"{name}.{method}: apply_rope (interleaved, the model's own sin/cos table)"))


def _sinusoidal_apply_for(fn, dtype, device):
    params = list(inspect.signature(fn).parameters)
    if params[:3] != ["sinusoidal_pos", "query_layer", "key_layer"]:
        return f"takes ({', '.join(params)}), not (sinusoidal_pos, query_layer, key_layer[, value_layer])"
    generator = torch.Generator().manual_seed(0)
    angles = torch.arange(9.0)[:, None] * 100.0 ** (-torch.arange(0, 8, 2) / 8)
    table = torch.cat([torch.sin(angles), torch.cos(angles)], -1)[None, None].to(dtype=dtype, device=device)
    q, k, v = (torch.randn(2, 3, 9, 8, generator=generator).to(dtype=dtype, device=device) for _ in range(3))
    diff = _compare_apply(fn, apply_rotary_position_embeddings, [((table, q, k), {}), ((table, q, k, v), {})], dtype)
    if diff is None:
        return "it does not run on (sinusoidal_pos [1, 1, seq, d], query_layer [batch, heads, seq, d], key_layer) probes"
    if not diff[0] <= diff[1]:
        return f"the interleaved layout differs by {diff[0]:.3g} (tolerance {diff[1]:.3g})"
    return apply_rotary_position_embeddings


def apply_rotary_position_embeddings(sinusoidal_pos, query_layer, key_layer, value_layer=None):
    """posenc's rotation of RoFormer's ``q``, ``k`` (and ``v``): pairs ``(x[2i], x[2i+1])`` by
    ``[sin | cos]``. (A function of this module, not a closure: a patched model pickles it by name.)"""
    sin, cos = sinusoidal_pos.chunk(2, dim=-1)
    cos, sin = cos.repeat_interleave(2, -1), sin.repeat_interleave(2, -1)
    layers = (query_layer, key_layer) if value_layer is None else (query_layer, key_layer, value_layer)
    return tuple(pe.apply_rope(x, cos, sin, layout="interleaved") for x in layers)


# --- T5 relative bias and ALiBi -------------------------------------------------------------


def _t5_parts(model, swaps, refusals):
    """Every layer holding a T5 ``relative_attention_bias`` embedding: its ``compute_bias`` (and LongT5's side bias)."""
    for name, layer in model.named_modules():
        embedding = getattr(layer, "relative_attention_bias", None)
        if not isinstance(embedding, nn.Embedding) or getattr(layer, "has_relative_attention_bias", True) is False:
            continue
        label = f"relative attention bias {name} ({type(layer).__name__})"
        try:
            bias = _t5_bias_checked(layer, embedding, label)
            swaps.append((_setter(layer, "compute_bias", bias), f"{name}.compute_bias: t5_bias"))
            side = getattr(layer, "global_relative_attention_bias", None)
            if isinstance(side, nn.Embedding):  # LongT5's transient-global attention: the local -> global side bias
                side_bias = _t5_side_bias_checked(layer, side, bias.bidirectional)
                swaps.append((_setter(layer, "compute_side_bias", side_bias), f"{name}.compute_side_bias: t5_bias"))
        except (_Refusal, ValueError, TypeError, AttributeError) as why:
            refusals.append(f"{label}: {_short(why)}")


# The replacements a layer holds are objects rather than closures: a deep copy of the model
# copies them with it, so the copy reads its own table (a closure kept the original's), and a
# pickled model keeps them.


class _T5Bias:
    """``layer.compute_bias(query_length, key_length, device=None, past_seen_tokens=0)``
    through :func:`posenc.t5_bias` of the layer's own table: ``[1, heads, query_length,
    key_length]``. The table is read from the layer on every call, as the layer's code reads
    it (``layer.<attribute>.weight``): a weight replaced after the patch (``load_state_dict(...,
    assign=True)``, a new ``nn.Parameter``) is the one used."""

    def __init__(self, layer, bidirectional, max_distance, attribute="relative_attention_bias"):
        self.layer, self.bidirectional, self.max_distance, self.attribute = layer, bidirectional, max_distance, attribute

    @property
    def table(self):
        return getattr(self.layer, self.attribute).weight

    def bias(self, q_len, k_len, **where):
        return pe.t5_bias(self.table, q_len, k_len, bidirectional=self.bidirectional, max_distance=self.max_distance, **where)

    def __call__(self, query_length, key_length, device=None, past_seen_tokens=0):
        return self.bias(query_length, key_length, offset=past_seen_tokens)[None]


class _LongT5LocalBias(_T5Bias):
    """LongT5's ``compute_bias(block_length)``: ``[1, 1, heads, block, 3 * block]``, queries of the middle block against all three."""

    def __call__(self, block_length):
        return self.bias(block_length, 3 * block_length, offset=block_length)[None, None]


def _t5_compute_bias(layer, bidirectional, max_distance):
    """The replacement of ``layer.compute_bias`` in the signature the layer has."""
    return (_LongT5LocalBias if _bias_form(layer) == "block" else _T5Bias)(layer, bidirectional, max_distance)


def _bias_form(layer):
    fn = getattr(layer, "compute_bias", None)
    if not callable(fn):
        raise _Refusal("no compute_bias method to replace (a relative bias posenc does not recognise)")
    params = list(inspect.signature(fn).parameters)
    if params == ["block_length"]:
        return "block"
    if params[:2] == ["query_length", "key_length"] and "past_seen_tokens" in params:
        return "full"
    raise _Refusal(f"compute_bias takes ({', '.join(params)}), not (query_length, key_length, ..., past_seen_tokens) or (block_length)")


def _t5_bias_checked(layer, embedding, label):
    """The ``_T5Bias`` of the layer's own table that reproduces its ``compute_bias`` (both directions tried
    when the layer does not say, as Pix2Struct's decoder, always causal, does not)."""
    form = _bias_form(layer)
    max_distance = getattr(layer, "relative_attention_max_distance", None)
    if max_distance is None:
        raise _Refusal("no relative_attention_max_distance")
    said = getattr(layer, "is_decoder", None)
    directions = (not said,) if said is not None else (True, False)
    probes = ((4,), (7,)) if form == "block" else ((5, 7, 0), (1, 9, 8), (6, 6, 2))
    differences = []
    for bidirectional in directions:
        ours = _t5_compute_bias(layer, bidirectional, max_distance)
        worst = 0.0
        for args in probes:
            kwargs = {} if form == "block" else {"past_seen_tokens": args[2]}
            with torch.no_grad():
                want, got = layer.compute_bias(*args[:2], **kwargs), ours(*args[:2], **kwargs)
            diff = float((want.double() - got.double()).abs().max()) if want.shape == got.shape else float("inf")
            worst = max(worst, diff)
        scale = float(embedding.weight.detach().abs().max())
        if worst <= 2 * _eps(embedding.weight.dtype) * scale:
            return ours
        differences.append(f"compute_bias differs from posenc's ({'bidirectional' if bidirectional else 'causal'}) by {worst:.3g}")
    raise _Refusal("; ".join(differences))


def _t5_side_bias_checked(layer, embedding, bidirectional):
    """LongT5's ``compute_side_bias(mask, global_segment_ids)``: each token's T5 bias to the global blocks.

    A token of block ``b`` sits at position ``b``, global block ``g`` at ``g`` (``-1e10`` where
    the token's segment is not the block's, as LongT5 masks it); the block ids are LongT5's own
    (``_make_global_fixed_block_ids`` of its modeling module).
    """
    theirs = layer.compute_side_bias
    block_ids_of = type(layer).compute_side_bias.__globals__.get("_make_global_fixed_block_ids")
    if not callable(block_ids_of):
        raise _Refusal("compute_side_bias: LongT5's _make_global_fixed_block_ids is not beside it")
    side = _T5Bias(layer, bidirectional, layer.relative_attention_max_distance, attribute="global_relative_attention_bias")
    compute_side_bias = _LongT5SideBias(side, layer.global_block_size, block_ids_of)
    for length, pad in ((12, 3), (9, 0), (17, 5)):
        mask = torch.ones(2, length, dtype=torch.long, device=embedding.weight.device)
        mask[1, :pad] = 0
        _, segments = block_ids_of(mask, layer.global_block_size)
        with torch.no_grad():
            want, got = theirs(mask, segments), compute_side_bias(mask, segments)
        diff = float((want.double() - got.double()).abs().max()) if want.shape == got.shape else float("inf")
        if not diff <= 2 * _eps(embedding.weight.dtype) * float(embedding.weight.detach().abs().max()):
            raise _Refusal(f"compute_side_bias differs from posenc's by {diff:.3g}")
    return compute_side_bias


_ALIBI_NAME = re.compile(r"^build_\w*alibi\w*$")


class _LongT5SideBias:
    """LongT5's ``compute_side_bias(mask, global_segment_ids)`` through ``side``, a
    ``_T5Bias`` on the layer's global table: each token's bias to every global block,
    ``[batch, heads, seq, globals]``, masked."""

    def __init__(self, side, global_block_size, block_ids_of):
        self.side, self.global_block_size, self.block_ids_of = side, global_block_size, block_ids_of

    def __call__(self, mask, global_segment_ids):
        same_segment = torch.eq(mask[..., None], global_segment_ids[:, None, :])[:, None, ...]
        block_ids, _ = self.block_ids_of(mask, self.global_block_size)
        globals_ = torch.arange(global_segment_ids.shape[-1], device=mask.device)
        bias = self.side.bias(mask.shape[-1], globals_.shape[0], query_positions=block_ids.long(), key_positions=globals_)
        return torch.where(same_segment, 0.0, -1e10) + bias


def _alibi_parts(model, device, swaps, refusals):
    """ALiBi builders a module's ``forward`` calls, as its method (BLOOM, MPT) or a global (Falcon)."""
    for name, module in model.named_modules():
        forward = _forward_code(module)
        if forward is None:
            continue
        where = name or "model"
        rebinds, rebound = {}, []
        for builder in sorted(n for n in forward.__code__.co_names if _ALIBI_NAME.match(n)):
            method = callable(getattr(type(module), builder, None))
            theirs = getattr(module, builder) if method else forward.__globals__.get(builder)
            if not callable(theirs):
                continue
            label = f"ALiBi builder {where}.{builder} ({type(module).__name__})"
            try:
                ours, what = _alibi_replacement(theirs, module, device)
            except (_Refusal, TypeError, ValueError, RuntimeError) as why:
                refusals.append(f"{label}: {_short(why)}")
                continue
            if method:
                swaps.append((_setter(module, builder, ours), f"{where}.{builder}: {what}"))
            else:
                rebinds[builder] = ours
                rebound.append(f"{where} {builder}: {what}")
        if "_get_alibi_slopes" in forward.__code__.co_names and callable(forward.__globals__.get("_get_alibi_slopes")):
            theirs = forward.__globals__["_get_alibi_slopes"]  # BLOOM's forward reads the slopes themselves too
            heads = sorted({int(getattr(module, "num_heads", 0) or 0) or 4, *range(1, 33), 48, 64})
            differ = [h for h in heads if not _same(theirs(h, device), _alibi_slopes(h, device))]
            if differ:
                refusals.append(f"ALiBi slopes _get_alibi_slopes of {type(module).__name__}: differ from posenc's for {differ} heads")
                continue
            rebinds["_get_alibi_slopes"] = _alibi_slopes
            rebound.append(f"{where} _get_alibi_slopes: alibi_slopes")
        refusal = _rebinding_refusal(where, module, sorted(rebinds)) if rebinds else None
        if refusal is not None:
            refusals.append(refusal)
        elif rebinds:
            swaps.append((_rebinder(module, rebinds), tuple(rebound)))


def _alibi_replacement(theirs, module, device):
    """``(replacement, description)`` of an ALiBi builder checked on probes, or ``_Refusal``.

    Two forms: ``(attention_mask, num_heads, dtype)`` (BLOOM, Falcon: slopes times the padded
    key positions, ``[batch * heads, 1, kv]``) and ``(num_heads, sequence_length,
    alibi_bias_max, device)`` (MPT: slopes times ``key - (sequence_length - 1)``, ``[heads, 1,
    kv]``).
    """
    params = list(inspect.signature(theirs).parameters)
    heads = sorted({int(getattr(module, "num_heads", 0) or 0) or 4, 5, 12})
    if params[:3] == ["attention_mask", "num_heads", "dtype"]:
        candidates = ((bloom_alibi_tensor, "alibi_bias"), (falcon_alibi_tensor, "alibi_bias (in bfloat16)"))
        probes = []
        for length, mask_dtype in itertools.product((11, 300), (torch.long, torch.float32)):
            mask = torch.ones(2, length, dtype=mask_dtype, device=device)
            mask[1, :4] = 0
            probes += [(mask, h, torch.float32) for h in heads]
        tolerance = 0.0  # (BLOOM's and Falcon's bits: the same slopes times the same positions)
    elif params[:2] == ["num_heads", "sequence_length"]:
        candidates = ((mpt_alibi_tensor, "alibi_bias"),)
        probes = [(h, length, bias_max, device) for h in heads for length in (1, 11, 300) for bias_max in (8, 4, 12.5)]
        tolerance = 0.0  # (MPT's bits: the same slopes, rounded as MPT rounds them, times the same distances)
    else:
        raise _Refusal(f"takes ({', '.join(params)}), not (attention_mask, num_heads, dtype) or (num_heads, sequence_length, ...)")
    differences = []
    for ours, what in candidates:
        worst = None
        for args in probes:
            with torch.no_grad():
                want, got = theirs(*args), ours(*args)
            if not _same(want, got):
                diff = float((want.double() - got.double()).abs().max()) if want.shape == got.shape else float("inf")
                worst = max(worst or 0.0, diff / max(1.0, float(want.abs().max())))
        if worst is None or (tolerance and worst <= tolerance):
            return ours, what
        differences.append(f"{what} differs by {worst:.3g} (relative)")
    raise _Refusal("; ".join(differences))


def _same(want, got):
    return want.shape == got.shape and want.dtype == got.dtype and bool(torch.equal(want, got))


def _alibi_slopes(num_heads, device):
    """:func:`posenc.alibi_slopes` as BLOOM rounds them (its ``_get_alibi_slopes``, and
    Falcon's ``build_alibi_tensor``): float32 ``[num_heads]`` on ``device``.

    The slopes are two geometric sequences, ``r**h`` for the first ``p`` heads (``p`` the
    largest power of two up to ``num_heads``) and ``s**(2h - 1)`` for the rest, ``r`` and
    ``s`` their first slopes. ``alibi_slopes`` rounds each slope once from float64; BLOOM
    rounds the two ratios (the same float32 numbers) and raises them to the integer
    exponents with torch's float32 ``pow`` on the mask's device, whose results are an ulp
    off some of the others unless the head count is 1, 2, 4 or 8 (14 of 16 slopes at 16
    heads). So do these, one ``pow`` per sequence as there: which elements of a call
    torch's CPU ``pow`` computes in SIMD depends on the call's length.
    """
    power, ratios = _slope_ratios(num_heads)
    exponents = ((1, power + 1, 1), (1, 2 * (num_heads - power), 2))
    slopes = [
        torch.pow(torch.full((), ratio, dtype=torch.float32, device=device), torch.arange(*steps, dtype=torch.int32, device=device))
        for ratio, steps in zip(ratios, exponents)
    ]  # fmt: skip
    return slopes[0] if len(slopes) == 1 else torch.cat(slopes)


_SLOPES = {}  # (the original, num_heads, device, its options) -> the builders' slopes


def _kept_slopes(key, make):
    """``make()``, the slopes of a builder, made once per ``key`` (head count, device and the
    original's options): the original's ``pow`` is a third of a short call's time. The
    builders only read them. Made and kept outside inference mode (an inference tensor serves
    no autograd), not while torch traces (``torch.compile``: a fake tensor) or captures a CUDA
    graph, which make them afresh."""
    slopes = _SLOPES.get(key)
    if slopes is not None and not torch.compiler.is_compiling():
        return slopes
    with torch.inference_mode(False):
        slopes = make()
    if type(slopes) is torch.Tensor and not torch.compiler.is_compiling() and not (slopes.is_cuda and torch.cuda.is_current_stream_capturing()):
        _SLOPES[key] = slopes
    return slopes


def _builder_slopes(num_heads, device, rounding, dtype):
    """``_alibi_slopes`` rounded to ``rounding`` (float32: BLOOM's; bfloat16: Falcon's), as
    ``dtype``, kept (``_kept_slopes``)."""
    return _kept_slopes(("bloom", num_heads, device, rounding, dtype), lambda: _alibi_slopes(num_heads, device).to(rounding).to(dtype))


@functools.lru_cache(maxsize=256)
@torch.compiler.assume_constant_result  # (torch.compile takes the numbers, not alibi_slopes' NumPy)
def _slope_ratios(num_heads):
    """``(p, ratios)``: the largest power of two ``p`` up to ``num_heads`` and the ratio of each
    of :func:`posenc.alibi_slopes`' geometric sequences (one for a power of two, else two), its first slope."""
    slopes = pe.alibi_slopes(num_heads)
    power = 1 << (int(slopes.shape[0]).bit_length() - 1)
    return power, tuple(float(slopes[i]) for i in (0, power)[: 1 + (power < num_heads)])


def bloom_alibi_tensor(attention_mask, num_heads, dtype):
    """BLOOM's ``build_alibi_tensor`` with posenc: ``[batch * heads, 1, kv]`` ALiBi of the key positions.

    BLOOM adds ``slope * key_position`` (positions from the padding mask), which differs
    from ALiBi's ``-slope * (query - key)`` by a constant per query row that softmax
    ignores; it is :func:`posenc.alibi_bias` with the query at position 0, of posenc's
    slopes rounded as BLOOM rounds them (``_alibi_slopes``): BLOOM's bits.
    """
    return _key_position_alibi(attention_mask, num_heads, torch.float32, dtype)


def falcon_alibi_tensor(attention_mask, num_heads, dtype):
    """Falcon's ``build_alibi_tensor`` (``alibi=True``): BLOOM's, computed in bfloat16.

    Falcon multiplies bfloat16 slopes by the key positions of an integer mask in bfloat16
    (positions past 256 round to even numbers, then each product rounds), so its bias is
    :func:`posenc.alibi_bias` of bfloat16 slopes and positions rounded to bfloat16; a float32
    mask's positions promote the product to float32, as there.
    """
    return _key_position_alibi(attention_mask, num_heads, torch.bfloat16, dtype)


def _key_position_alibi(attention_mask, num_heads, rounding, dtype):
    """``slopes * key_position``, the builders' tensor, of slopes rounded to ``rounding``:
    their positions ``(cumsum(mask) - 1) * mask`` in the mask's dtype
    (:func:`posenc.positions_from_mask`'s for a mask of ones and zeros), each rounded to the
    dtype torch promotes the product to, the slopes' and the positions', as that product
    rounds it. Integers, they are :func:`posenc.alibi_bias`'s key positions as int64 (its
    kernel's path); a bfloat16 product is the float32 one, which is exact (8-bit
    significands), rounded once, as torch's bfloat16 product is."""
    batch, length = attention_mask.shape
    keys = attention_mask.cumsum(-1).sub_(1).mul_(attention_mask)  # (in place: a fresh sum)
    work = torch.promote_types(rounding, keys.dtype)
    if length - 1 > 2 / torch.finfo(work).eps:  # (up to 2 / eps work holds every integer)
        keys = keys.to(work)
    keys = keys.long() if keys.is_floating_point() else keys
    slopes = _builder_slopes(num_heads, attention_mask.device, rounding, torch.promote_types(work, torch.float32))
    bias = pe.alibi_bias(slopes, 1, length, offset=0, key_positions=keys).reshape(batch * num_heads, 1, length)
    bias = bias if bias.dtype == work else bias.to(work)
    return bias if bias.dtype == dtype else bias.to(dtype)


def mpt_alibi_tensor(num_heads, sequence_length, alibi_bias_max=8, device=None):
    """MPT's ``build_mpt_alibi_tensor`` with posenc: ``[heads, 1, sequence_length]``.

    ``slope * (key - (sequence_length - 1))``: :func:`posenc.alibi_bias` of the last query
    (``offset = sequence_length - 1``) with :func:`posenc.alibi_slopes` of ``max_bias =
    alibi_bias_max`` (MPT's slopes are Press et al.'s), rounded as MPT rounds them
    (``_mpt_slopes``): MPT's bits. MPT ignores padding: so does this.
    """
    return pe.alibi_bias(_mpt_slopes(num_heads, float(alibi_bias_max), device), 1, sequence_length, offset=sequence_length - 1)


def _mpt_slopes(num_heads, max_bias, device):
    """:func:`posenc.alibi_slopes` of ``max_bias`` as MPT rounds them: ``2**(-k max_bias / P)``
    for ``P`` the power of two at or above ``num_heads`` (``k = 1 .. P``, or ``2, 4, .., P``
    then ``1, 3, ..`` for fewer heads: Press et al.'s order, posenc's), each the float32
    reciprocal of torch's float32 ``pow`` of the float32 exponent ``k * (max_bias / P)``, over
    all ``P`` exponents in one call as there (``alibi_slopes`` rounds each once from the exact
    power: an ulp off some of these for a ``max_bias`` other than 8). Kept per head count,
    ``max_bias`` and device (``_kept_slopes``)."""
    return _kept_slopes(("mpt", num_heads, device, max_bias), lambda: _mpt_rounded(num_heads, max_bias, device))


def _mpt_rounded(num_heads, max_bias, device):
    power = 1 << (num_heads - 1).bit_length()
    exponents = torch.arange(1, power + 1, dtype=torch.int64, device=device).float() * (max_bias / power)
    slopes = 1.0 / torch.pow(2, exponents)
    return slopes if power == num_heads else torch.cat([slopes[1::2], slopes[::2]])[:num_heads]


# --- swapping -------------------------------------------------------------------------------


def _replacer(model, name, new):
    def swap():
        parent_name, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, attr, new)

    return swap


def _setter(obj, attr, value):
    return lambda: setattr(obj, attr, value)


def _rebinder(module, replacements):
    def swap():
        slot = _forward_slot(module)
        current = vars(module).get(slot)  # an earlier rebinding of this instance: its names are kept
        kept = current.replacements if isinstance(current, _ReboundForward) else {}
        setattr(module, slot, _ReboundForward(module, {**kept, **replacements}))

    return swap


def _forward_slot(module):
    """The instance attribute that gets ``module``'s rebound forward: ``"forward"``, or under
    a hook of accelerate's form (``module.forward`` its wrapper, which calls
    ``module._old_forward``, the class's forward bound to it) ``"_old_forward"``, so that the
    hook keeps running; None where the instance's own ``forward`` is something else."""
    own = vars(module)
    current, old = own.get("forward"), own.get("_old_forward")
    if current is None or isinstance(current, _ReboundForward):
        return "forward"
    if isinstance(old, _ReboundForward) or (isinstance(old, types.MethodType) and old.__self__ is module and old.__func__ is type(module).forward):
        return "_old_forward"
    return None


def _rebinding_refusal(where, module, names):
    """Why ``module``'s forward cannot be rebound to route ``names`` through posenc, or None."""
    if not _rebindable(type(module).forward):
        return _not_rebindable(where, module, names)
    if _forward_slot(module) is None:
        return (f"{where} ({type(module).__name__}): its instance's forward is replaced by a {type(vars(module)['forward']).__name__} "
                f"posenc cannot see into; patch_hf the model before wrapping its forwards (hooks) to route {', '.join(names)} through posenc")
    return None


class _ReboundForward:
    """``module.forward`` with the global names in ``replacements`` bound to posenc's functions
    (``_with_globals`` of the class's forward). It pickles as that recipe, each replacement
    made by a function of this module as its ``__posenc_recipe__`` says where it is not a
    module's global, and is rebuilt when loaded (a bound method pickles as the class's
    forward, which dropped the patch); a deep copy binds the copy."""

    __posenc__ = True

    def __init__(self, module, replacements):
        self.module, self.replacements = module, dict(replacements)
        self.method = types.MethodType(_with_globals(type(module).forward, self.replacements), module)
        self.__signature__ = inspect.signature(self.method)

    def __call__(self, *args, **kwargs):
        return self.method(*args, **kwargs)

    def __reduce__(self):
        return _rebound_forward, (self.module, {name: getattr(fn, "__posenc_recipe__", fn) for name, fn in self.replacements.items()})

    def __deepcopy__(self, memo):
        return _ReboundForward(copy.deepcopy(self.module, memo), self.replacements)


def _rebound_forward(module, recipes):
    """A pickled ``_ReboundForward``: each replacement as it was pickled, or made again from its ``(maker, arguments)``."""
    made = {name: recipe[0](*recipe[1]) if isinstance(recipe, tuple) else recipe for name, recipe in recipes.items()}
    return _ReboundForward(module, made)


def _recipe(fn, maker, *arguments):
    """``fn``, noted as what ``maker(*arguments)`` gives (a closure pickles as its recipe)."""
    fn.__posenc_recipe__ = (maker, arguments)
    return fn


def _wrapped_cell(fn):
    """The index of the closure cell of the decorator ``fn`` that holds ``fn.__wrapped__``, or None."""
    for i, cell in enumerate(fn.__closure__ or ()):
        try:
            if cell.cell_contents is fn.__wrapped__:
                return i
        except ValueError:  # an empty cell
            continue
    return None


def _rebindable(fn):
    """Whether ``_with_globals`` can rebind ``fn``: each decorator around it holds what it wraps in its closure."""
    while isinstance(getattr(fn, "__wrapped__", None), types.FunctionType):
        if _wrapped_cell(fn) is None:
            return False
        fn = fn.__wrapped__
    return isinstance(fn, types.FunctionType)


def _not_rebindable(where, module, names):
    return (f"{where} ({type(module).__name__}): its forward is wrapped by a decorator that does not hold the function it wraps; "
            f"cannot route {', '.join(names)} through posenc")


def _with_globals(fn, replacements):
    """A copy of ``fn`` whose global names in ``replacements`` are bound to new values.

    A decorated ``fn`` (``_rebindable``) is copied with a copy of the function it wraps in
    its closure, rebound the same way. Only the instance that gets it changes; its class and
    the transformers module are untouched.
    """
    if isinstance(getattr(fn, "__wrapped__", None), types.FunctionType):
        inner = _with_globals(fn.__wrapped__, replacements)
        at = _wrapped_cell(fn)
        new = _copy(fn, fn.__globals__, tuple(types.CellType(inner) if i == at else cell for i, cell in enumerate(fn.__closure__)))
        new.__wrapped__ = inner
        return new
    new = _copy(fn, _scope(fn.__globals__, replacements), fn.__closure__)
    weakref.finalize(new, _RELEASED.append, new.__globals__["__name__"])
    return new


def _scope(names, replacements):
    """The global names ``names`` with ``replacements``, as the namespace of a module of its
    own in ``sys.modules`` (``posenc._patched_<n>_<module>``). torch.compile guards what a
    function reads among its globals through the module its ``__name__`` names: under the
    transformers module's own name it guarded the originals (a closure among the
    replacements then failed its guard). The modules of functions collected since are
    removed first (not when collected: a collection may come while torch.compile iterates
    ``sys.modules``)."""
    while True:
        try:
            released = _RELEASED.pop()
        except IndexError:  # (emptied, perhaps by another thread's patch since this one looked)
            break
        sys.modules.pop(released, None)
    name = f"posenc._patched_{next(_SCOPES)}_{names['__name__'].replace('.', '_')}"
    module = types.ModuleType(name)
    module.__dict__.update({**names, **replacements, "__name__": name})
    sys.modules[name] = module
    return module.__dict__


_SCOPES = itertools.count()
_RELEASED = []  # the names of scope modules whose function was collected


def _copy(fn, scope, closure):
    """A copy of the function ``fn`` with globals ``scope`` and ``closure``, its name, defaults and attributes kept."""
    new = types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__, closure)
    new.__kwdefaults__ = fn.__kwdefaults__
    new.__dict__.update(fn.__dict__)
    new.__qualname__, new.__doc__, new.__module__ = fn.__qualname__, fn.__doc__, fn.__module__
    return new


def _short(error, limit=200):
    text = re.sub(r"\s+", " ", str(error)).strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


def patch_hf(model):
    """Route a loaded transformers model's positional computation through posenc, in place.

    The parts are recognised, not looked up by architecture name
    (:mod:`posenc.torch.hf_patch`):

    * every rotary module (``forward(x, position_ids) -> (cos, sin)`` with ``rope_type`` or
      ``inv_freq``) becomes an :class:`HFRotaryEmbedding` (float64 angles, every
      ``rope_type``);
    * every attention layer's ``apply_*rotary*`` function becomes :func:`posenc.apply_rope`
      (the kernels, CPU and GPU) in the layout that reproduces it: half or interleaved,
      partial rotary, any ``unsqueeze_dim``;
    * every layer owning T5's ``relative_attention_bias`` computes its bias with
      :func:`posenc.t5_bias` of the same weight, read from the layer on every call:
      T5, mT5, UMT5, LongT5 (local blocks, transient-global side bias), Switch
      Transformers, Pop2Piano, Pix2Struct's decoder;
    * the ALiBi builders of BLOOM (and its slopes), Falcon (``alibi=True``) and MPT come
      from :func:`posenc.alibi_bias` and :func:`posenc.alibi_slopes`.

    Before anything is swapped, each replacement runs beside the model's own code on probe
    inputs in the model's dtype and on its device. If every part matches within that
    dtype's rounding, all are swapped and ``model.posenc_patched`` lists them; otherwise
    nothing is swapped. In a float32 model the logits then equal the unpatched model's
    within float32 rounding and greedy ``generate()`` gives the same tokens (tested on every
    architecture transformers builds tiny: :data:`SUPPORTED`). In a float16 or bfloat16
    model they differ by that dtype's rounding (posenc rounds each rotated value once,
    transformers three times). The check runs once, here: the patched model's calls cost
    what posenc's kernels cost. Returns ``model``.

    Raises
    ------
    TypeError
        ``model`` is not a transformers model (a ``torch.nn.Module`` with a ``config``), or
        its dtype is not floating.
    ValueError
        A recognised part that posenc does not reproduce (the message names each part and
        the difference; the model is left unchanged), a model with no part posenc
        recognises, a model already patched, or one whose probe cannot run (meta device).
    """
    return patch(model)
