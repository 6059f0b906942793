"""Rotary position embeddings (RoPE), scalings and relatives."""

__all__: list[str] = []
