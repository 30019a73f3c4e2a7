"""Measurement: MEDUSA vs HF generate (bench), decode-step timing (profile), training memory/throughput."""
