"""Demo steps for the rotary family (see ``posenc._demo``)."""
