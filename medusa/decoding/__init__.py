"""MEDUSA decoding: tree proposals, one-pass tree verification, acceptance rules, KV-cache compaction."""

from medusa.decoding.acceptance import greedy_accept, sample_accept, typical_accept
from medusa.decoding.generate import MedusaGenerateOutput, medusa_generate
from medusa.decoding.processors import warp_logits

__all__ = ["MedusaGenerateOutput", "greedy_accept", "medusa_generate", "sample_accept", "typical_accept",
           "warp_logits"]
