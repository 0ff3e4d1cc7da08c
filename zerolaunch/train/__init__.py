"""The built-in training loop: `run_training(recipe, ctx)` (loop.py) and the pieces it is made of.

context.py (what the worker knows about its process), batches.py (calling user builders, moving batches,
finding the loss), seeding.py (RNG seeding and state), reporting.py (the one call site of the Reporter),
checkpointing.py (the save / resume hook), init_weights.py (model.init_from), test_hooks.py (failure injection for the launcher's tests).
The loop knows nothing of model internals; the engine's collectives stay in zerolaunch.zero.comm.
"""
