"""Built-in datasets: `synthetic` (a learnable Markov token stream), `text` (byte-level plain text) and
`hf_text` (text / JSONL for Hugging Face causal LMs).

All return `BatchStream`s (stream.py): endless, deterministic per (seed, rank), and resumable through
`state_dict()` / `load_state_dict()` or `skip(n_batches)`, so a checkpoint can record the data position.
"""
