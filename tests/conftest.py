import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch

# Tiny test models run fastest on one thread, and the suite then leaves a core free.
torch.set_num_threads(1)
