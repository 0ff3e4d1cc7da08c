"""ZeRO stages 0-2: flat parameter buffers and the bucketed gradient reducer.

- `flat_sharding.py`: `FlatSharding`, the strategy the `Engine` runs for stages 0, 1 and 2.
- `reducer.py`: the flat param / grad buffers, bucket views, and the gradient reducers (`BackwardReducer`
  for stage 2's reduce-scatter during backward, `DirectAccumulator` for world size 1, `reduce_full_grads`
  for stages 0/1 at the boundary).
"""
