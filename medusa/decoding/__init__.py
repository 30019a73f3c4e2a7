"""MEDUSA decoding: tree candidates, one-pass tree verification, acceptance rules, KV-cache compaction."""

from medusa.decoding.acceptance import greedy_accept, sample_accept, typical_accept, warp_logits
from medusa.decoding.generate import MedusaGenerateOutput, medusa_generate

__all__ = ["MedusaGenerateOutput", "greedy_accept", "medusa_generate", "sample_accept", "typical_accept",
           "warp_logits"]
