"""The built-in training loop: `run_training(recipe, ctx)` (loop.py) and the pieces it is made of.

context.py (what the worker knows about its process), batches.py (calling user builders, moving batches,
finding the loss), seeding.py (RNG seeding and state), reporting.py (the one call site of the Reporter),
checkpointing.py (the save / resume hook), init_weights.py (model.init_from), entrypoint.py
(a user's `entrypoint:` script in place of the loop, and the group a torchrun script gets).
The loop knows nothing of model internals; the engine's collectives stay in zerolaunch.zero.comm.
"""
