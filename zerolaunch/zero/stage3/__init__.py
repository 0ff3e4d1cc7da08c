"""ZeRO stage 3: params partitioned into units, gathered one unit at a time around its forward/backward.

- `unit_sharding.py`: `UnitSharding`, the strategy the `Engine` runs for stage 3.
- `partition.py`: the model split into units (the root unit first) and which unit owns each param.
- `materialize.py`: meta-device init, one unit materialized (and sharded) at a time.
- `unit_buffers.py`: `UnitFlat`, a unit's flat buffers: its shard, the gathered full params, its grad views.
- `unit.py`: `Stage3Unit`, a unit's owner: its params, buffers, staged grads, reduce-scatter, schedule state.
- `schedule.py`: `Stage3Schedule`, the module hooks that gather, prefetch, release and reduce units.
- `fragments.py`: the checkpoint side (owned fragments, their state, the streamed full params).
"""
