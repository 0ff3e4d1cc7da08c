"""The built-in GPT's sizes, torch-free: models/gpt.py builds from this table, and config/hidden.py reads the
hidden size of a size name from it without importing torch."""

SIZES: dict[str, dict[str, int]] = {
    "tiny": {"n_layer": 2, "n_head": 2, "d_model": 64},
    "small": {"n_layer": 4, "n_head": 4, "d_model": 256},
    "125m": {"n_layer": 12, "n_head": 12, "d_model": 768},
    "350m": {"n_layer": 24, "n_head": 16, "d_model": 1024},
    "760m": {"n_layer": 24, "n_head": 16, "d_model": 1536},
    "1.3b": {"n_layer": 24, "n_head": 32, "d_model": 2048},
}
