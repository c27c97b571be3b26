"""The vLLM engine line: what its two runner families (v1/, mrv2/) share, and its releases (releases/)."""
