"""Drafters: the protocols and a registry by name (built-ins are found there by name too)."""

from specwise.drafters.base import (DraftProposal, Drafter, DrafterContext, DrafterFactory, FeatureDrafter,
                                    FreeDrafter, PromptCachingDrafter, ScoreReader, SelfDrafter, TreeDrafter,
                                    TreeProposal, available_drafters, create_drafter, forget_prompts,
                                    register_drafter)
from specwise.drafters.cross_vocab_drafter import CrossVocabDrafter
from specwise.drafters.draft_model import DraftModelDrafter
from specwise.drafters.ngram import NgramDrafter, NoDrafter
from specwise.drafters.pairing import VocabularyMismatchError
from specwise.drafters.recycle import RecycleDrafter
from specwise.drafters.scope import current_scope, sharing_scope
from specwise.drafters.suffix import SuffixDrafter

__all__ = ["CrossVocabDrafter", "DraftModelDrafter", "DraftProposal", "Drafter", "DrafterContext", "DrafterFactory",
           "FeatureDrafter", "FreeDrafter", "NgramDrafter", "NoDrafter", "PromptCachingDrafter", "RecycleDrafter",
           "ScoreReader", "SelfDrafter", "SuffixDrafter", "TreeDrafter", "TreeProposal", "VocabularyMismatchError",
           "available_drafters", "create_drafter", "current_scope", "forget_prompts", "register_drafter",
           "sharing_scope"]
