"""Built-in models: `gpt` (the GPT decoder of the shipped recipes) and `hf` (any Hugging Face causal LM).
Models never import torch.distributed and know nothing of the engine that trains them."""
