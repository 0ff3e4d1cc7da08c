"""Built-in datasets: `synthetic` (a learnable Markov token stream) and `text` (byte-level plain text).

Both return `BatchStream`s (stream.py): endless, deterministic per (seed, rank), and resumable through
`state_dict()` / `load_state_dict()` or `skip(n_batches)`, so a checkpoint can record the data position.
"""
