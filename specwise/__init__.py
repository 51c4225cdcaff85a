"""specwise: lossless speculative decoding.

    import specwise
    result = specwise.generate("Write a Python function that reverses a string.")
    print(result.text, result.stats.acceptance_length)
"""

from specwise.api import SpecDecoder, generate, stream
from specwise.config import SamplingParams, SpecConfig
from specwise.conversation import Conversation
from specwise.drafters import (DraftProposal, Drafter, FeatureDrafter, FreeDrafter, TreeDrafter, TreeProposal,
                               available_drafters, register_drafter, sharing_scope)
from specwise.engine import GenerationResult, GenerationStream, SpeculativeEngine
from specwise.stats import SpecStats
from specwise.store.loading import LoadedModel, load_model
from specwise.prefix_cache import PrefixCache, PrefixCacheStats
from specwise.stopping import TokenEvent
from specwise.verify import VerifyResult, verify_block, verify_greedy, verify_tokens

__version__ = "0.1.0"

__all__ = ["Conversation", "DraftProposal", "Drafter", "FeatureDrafter", "FreeDrafter", "GenerationResult", "GenerationStream",
           "LoadedModel", "PrefixCache", "PrefixCacheStats", "SamplingParams", "SpecConfig", "SpecDecoder", "SpecStats", "SpeculativeEngine",
           "TokenEvent", "TreeDrafter", "TreeProposal", "VerifyResult", "available_drafters", "generate", "load_model",
           "register_drafter", "sharing_scope", "stream", "verify_block", "verify_greedy", "verify_tokens"]
