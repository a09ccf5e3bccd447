"""Reference models that autoplan plans: LLaMA-3 (:mod:`.llama3`), a tiny MLP (:mod:`.mlp`)
and Hugging Face models built from their config (:mod:`.hf`).

In: a model's arguments (a run file's ``model`` section). Out: an ``nn.Module``, usually
built on the meta device. May import: :mod:`autoplan.core` alone.
"""

from autoplan.models.llama3 import ModelArgs, Transformer
from autoplan.models.mlp import TinyMLP

__all__ = ["ModelArgs", "TinyMLP", "Transformer"]
