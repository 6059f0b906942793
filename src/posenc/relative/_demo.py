"""Demo steps for the relative family (see ``posenc._demo``)."""
