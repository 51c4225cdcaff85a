"""Drafters: the protocols and a registry by name (built-ins are found there by name too)."""

from specwise.drafters.base import (DraftProposal, Drafter, DrafterContext, DrafterFactory, FeatureDrafter,
                                    PromptCachingDrafter, TreeDrafter, TreeProposal, available_drafters,
                                    create_drafter, forget_prompts, register_drafter)
from specwise.drafters.draft_model import DraftModelDrafter, VocabularyMismatchError
from specwise.drafters.ngram import NgramDrafter, NoDrafter

__all__ = ["DraftModelDrafter", "DraftProposal", "Drafter", "DrafterContext", "DrafterFactory", "FeatureDrafter",
           "NgramDrafter", "NoDrafter", "PromptCachingDrafter", "TreeDrafter", "TreeProposal",
           "VocabularyMismatchError", "available_drafters", "create_drafter", "forget_prompts", "register_drafter"]
