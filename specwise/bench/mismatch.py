"""The bench's greedy identity check lives in the library: specwise.numerics."""

from specwise.numerics import (DEFAULT_TIE_ULPS, FAILURE, NUMERICAL, Mismatch, check_identity, classify,
                               first_divergence, target_logits)

__all__ = ["DEFAULT_TIE_ULPS", "FAILURE", "NUMERICAL", "Mismatch", "check_identity", "classify",
           "first_divergence", "target_logits"]
