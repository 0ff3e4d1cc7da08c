"""Built-in models. `gpt` is the GPT decoder used by the shipped recipes; models never import
torch.distributed and know nothing of the engine that trains them."""
