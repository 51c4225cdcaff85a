"""EAGLE-style drafting: a one-layer head over the target's fused hidden states.

head.py (the module), features.py (the target's hidden states), data.py (recording
them over a corpus), train.py (the objective and the loop), io.py (files bound to
their target), drafter.py (the `eagle` drafter), commands.py (`specwise train-drafter`).
"""

from specwise.eagle.drafter import EagleDrafter, MissingFeaturesError
from specwise.eagle.head import EagleHead, HeadCache, HeadConfig, config_for_target, default_feature_layers
from specwise.eagle.io import TargetMismatchError, load_head, read_head, save_head, target_fingerprint

__all__ = ["EagleDrafter", "EagleHead", "HeadCache", "HeadConfig", "MissingFeaturesError", "TargetMismatchError",
           "config_for_target", "default_feature_layers", "load_head", "read_head", "save_head",
           "target_fingerprint"]
