"""ZeRO stages 0-2: flat parameter buffers and the bucketed gradient reducer.

- `flat_sharding.py`: `FlatSharding`, the strategy the `Engine` runs for stages 0, 1 and 2.
- `reducer.py`: the flat param buffers, bucket views, the `GradPath` protocol and the hooked gradient
  reducers (`BackwardReducer` for stage 2's reduce-scatter during backward, over one `BucketUnit` per
  bucket; `DirectAccumulator` for world size 1).
- `full_grads.py`: `FullGrads`, stages 0/1's full-size grad buffers, reduced at the boundary.
"""
