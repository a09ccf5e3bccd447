"""Reference models that autoplan plans: LLaMA-3 (:mod:`.llama3`) and a tiny MLP (:mod:`.mlp`)."""

from autoplan.models.llama3 import ModelArgs, Transformer
from autoplan.models.mlp import TinyMLP

__all__ = ["ModelArgs", "TinyMLP", "Transformer"]
