"""Drafters: one protocol, a registry by name. Importing this package registers the built-ins."""

from specwise.drafters.base import (DraftProposal, Drafter, DrafterContext, DrafterFactory, TreeDrafter,
                                    TreeProposal, available_drafters, create_drafter, register_drafter)
from specwise.drafters import draft_model as _draft_model  # noqa: F401  (registers "draft-model")
from specwise.drafters import ngram as _ngram  # noqa: F401  (registers "ngram", "none")
from specwise.eagle import drafter as _eagle  # noqa: F401  (registers "eagle")
from specwise.drafters.draft_model import DraftModelDrafter, VocabularyMismatchError
from specwise.drafters.ngram import NgramDrafter, NoDrafter

__all__ = ["DraftModelDrafter", "DraftProposal", "Drafter", "DrafterContext", "DrafterFactory",
           "NgramDrafter", "NoDrafter", "TreeDrafter", "TreeProposal", "VocabularyMismatchError", "available_drafters",
           "create_drafter", "register_drafter"]
