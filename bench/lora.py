"""LoRA fine-tuning on one GPU: zerolaunch ZeRO-3 against DeepSpeed ZeRO-3 and FSDP2 + PEFT, step time and peaks.

    python bench/lora.py --size 8b                                   # zl-z3, ds-z3, fsdp2 at a Llama-3-8B shape
    python bench/lora.py --size 34b --rows zl-z3-offp,ds-z3-offp     # a CodeLlama-34B-like shape, params on the host
    python bench/lora.py --size 40b --rows zl-z3-offp                # 43.4e9 params: the bf16 base (80.9 GiB)
                                                                     # exceeds an 80 GB card (34b: 62.9 GiB)
    python bench/lora.py --size 34b --rows fsdp2-offp,ds-z3-offp     # the peers, params on the host
    python bench/lora.py --tiny --device cpu --rows zl-z3,fsdp2      # a 2-layer model (tests/unit/test_bench_lora.py)

The model is transformers' LlamaForCausalLM (bf16, sdpa, random init, no download) built on the meta device where
the row's engine can initialize it piece by piece; PEFT's get_peft_model puts a LoRA adapter (r 16, alpha 32,
dropout 0) on every linear layer of the decoder (q, k, v, o, gate, up, down); HF's gradient checkpointing is on
(use_reentrant False); AdamW (lr 1e-4, no weight decay, clip 1.0) steps the adapter only. Rows, one process each:

- zl-z3:       `zerolaunch.initialize(model, ds_config)` at stage 3, bf16: the frozen base sharded in its units
               (the decoder layers), built on meta and initialized unit by unit, the adapter with an fp32 master.
- zl-z3-offp:  the same with `offload_param: {device: cpu}`. offload_optimizer stays off: the base is what does
               not fit, and the adapter's AdamW state is small (about 0.1 GiB at 34B), so a user offloading the
               base has no reason to move it (and DeepSpeed would then JIT-build its CPU Adam).
- ds-z3 / ds-z3-offp: DeepSpeed ZeRO-3 with the same config dict: the model built by `_from_config` while an
               `HfDeepSpeedConfig` is alive (transformers builds it under deepspeed.zero.Init, as from_pretrained
               does), get_peft_model, `deepspeed.initialize` with the trainable params.
- fsdp2:       accelerate's FSDP2 + PEFT (accelerate's fsdp2_prepare_model): the trainable (LoRA) params upcast
               to fp32, the frozen base kept bf16; fully_shard on each decoder layer, on the input embedding, on
               [final norm, lm_head] together (reshard_after_forward False) and on the root, with
               MixedPrecisionPolicy(param_dtype bf16, reduce_dtype fp32); built on meta, then to_empty on the GPU
               and initialized there. torch's AdamW (fused on CUDA) over the trainable params.
- fsdp2-offp:  the same with CPUOffloadPolicy(pin_memory=True) on every fully_shard: each group (a decoder
               layer, the embedding, [norm, lm_head]) is made real on the GPU, initialized and sharded in turn,
               FSDP2 moving its shard to pinned host memory, so the GPU never holds the base.

Every row builds the base with the same name-seeded init (`SeededLlama`: each weight drawn from a generator seeded
by its name, so the values do not depend on the engine or on the order it initializes in) and PEFT's LoRA init
(B = 0, so the first loss is the base model's: rows agree on it). A row prints `RESULT {json}`: median step ms over
the timed steps (CUDA events), tokens/s, peak GPU allocated over the whole run and over the timed steps, peak host
memory (VmHWM and a sampled RssAnon), trainable and total param counts, build seconds, first and final loss. A
row that fails (CUDA OOM, killed for host memory, timeout) is recorded as its error. The driver prints a table last
(each row's ratio to the fastest peer of the same offload kind) and writes lora-SIZE.json under --out.
The ds-* rows need DeepSpeed on the GPU machine: see bench/fetch_wheels.sh.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
import zlib
from pathlib import Path

from _row_process import TINY_LLAMA, init_single_rank_group, pick_rows, print_result, row_result

ROWS = ("zl-z3", "zl-z3-offp", "ds-z3", "ds-z3-offp", "fsdp2", "fsdp2-offp")
PEERS = {False: ("ds-z3", "fsdp2"), True: ("ds-z3-offp", "fsdp2-offp")}  # by "offloads params"
SIZES = {
    "8b": dict(  # Llama-3-8B
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=128256,
        rope_theta=500000.0,
    ),
    "34b": dict(  # CodeLlama-34B-like
        hidden_size=8192,
        intermediate_size=22016,
        num_hidden_layers=48,
        num_attention_heads=64,
        num_key_value_heads=8,
        vocab_size=32000,
        rope_theta=1000000.0,
    ),
    # the 34b shape with 62 decoder layers (43.4e9 params): its bf16 base (80.9 GiB) is more than an 80 GB card
    # holds (79.1 GiB), and at about 1.05x on the host with offload_param it fits a 125 GiB host
    "40b": dict(
        hidden_size=8192,
        intermediate_size=22016,
        num_hidden_layers=62,
        num_attention_heads=64,
        num_key_value_heads=8,
        vocab_size=32000,
        rope_theta=1000000.0,
    ),
    "tiny": TINY_LLAMA,
}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
LORA = dict(r=16, lora_alpha=32, lora_dropout=0.0)
LR, CLIP = 1e-4, 1.0


def llama_config(size: str, seq_len: int, layers: int | None = None):
    """The --size shape; `layers` replaces its decoder layer count (--layers)."""
    from transformers import LlamaConfig

    shape = dict(SIZES[size])
    if layers:
        shape["num_hidden_layers"] = layers
    return LlamaConfig(
        **shape,
        max_position_embeddings=max(seq_len, 2048),
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        attn_implementation="sdpa",
    )


def seeded_llama_class():
    """LlamaForCausalLM whose HF init draws each weight from a generator seeded by the weight's name: the same
    values whichever engine initializes it, in whatever order and on whichever device."""
    import torch
    from transformers import LlamaForCausalLM

    class SeededLlama(LlamaForCausalLM):
        @torch.no_grad()
        def _init_weights(self, module):
            super()._init_weights(module)  # norms at 1, rotary tables
            names = getattr(self, "_seeded_names", None)
            if names is None or id(module) not in names:
                names = self._seeded_names = {id(m): n for n, m in self.named_modules()}
            prefix = names.get(id(module), "")
            std = self.config.initializer_range
            for key, p in module.named_parameters(recurse=False):
                if p.dim() < 2 or p.is_meta:
                    continue
                name = f"{prefix}.{key}".removeprefix(".").replace(".base_layer", "")
                g = torch.Generator(device=p.device).manual_seed(zlib.crc32(name.encode()))
                p.normal_(0.0, std, generator=g)

    return SeededLlama


def ds_config(row: str, micro_batch: int) -> dict:
    zero = {"stage": 3}
    if row.endswith("-offp"):
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    return {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": CLIP,
        "bf16": {"enabled": True},
        "zero_optimization": zero,
        # torch_adam + fused: torch's fused AdamW, as the fsdp2 row steps (DeepSpeed's own FusedAdam would be
        # JIT-built first, minutes on a machine without prebuilt ops); zerolaunch notes both keys and runs its own
        "optimizer": {
            "type": "AdamW",
            "params": {"lr": LR, "weight_decay": 0.0, "torch_adam": True, "fused": True},
        },
        "steps_per_print": 10**9,
    }


def plain_step(model, *, fused: bool):
    """A peer's training step without an engine: backward, clip at CLIP, torch AdamW (lr LR, no decay) over the
    trainable params; returns the loss. bench/longseq.py's plain rows take it too."""
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=LR, weight_decay=0.0, fused=fused)

    def step(batch):
        loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, CLIP)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return step


def add_lora(model):
    """PEFT's LoRA on every linear layer of the decoder, and HF's non-reentrant gradient checkpointing."""
    from peft import LoraConfig, get_peft_model

    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = get_peft_model(model, LoraConfig(**LORA, target_modules=TARGETS, task_type="CAUSAL_LM"))
    model.train()
    return model


def param_counts(model) -> tuple[int, int]:
    """(trainable, total) param counts, read before any engine reshapes the params (meta tensors count too)."""
    seen: set[int] = set()
    trainable = total = 0
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += p.numel()
        trainable += p.numel() if p.requires_grad else 0
    return trainable, total


def _init_module_tree(model, roots=None) -> None:
    """The fsdp2 rows' init after to_empty: HF's (seeded) init for the base's modules, PEFT's for each LoRA
    layer's adapter (B = 0), as PEFT and transformers would have done on real tensors. roots: only the
    modules of these subtrees (default: the whole model)."""
    import torch
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    adapter_ids = {
        id(m)
        for layer in model.modules()
        if isinstance(layer, LoraLayer)
        for attr in layer.adapter_layer_names
        if isinstance(getattr(layer, attr, None), torch.nn.Module)
        for m in getattr(layer, attr).modules()
    }
    modules = model.modules() if roots is None else (m for root in roots for m in root.modules())
    with torch.no_grad():
        for module in modules:
            if isinstance(module, LoraLayer):
                for adapter in module.lora_A.keys():
                    module.reset_lora_parameters(adapter, True)
            elif id(module) not in adapter_ids:
                base._init_weights(module)


def build_row(row: str, args, device):
    """(step(batch) -> loss, state() -> {name: fp32 CPU tensor} of every weight, info dict) for one row."""
    import torch

    torch.manual_seed(0)
    config = llama_config(args.size, args.seq_len, getattr(args, "layers", None))
    Seeded = seeded_llama_class()
    bf16 = torch.bfloat16
    if row.startswith("zl-"):
        import zerolaunch

        with torch.device("meta"):
            model = Seeded._from_config(config, dtype=bf16)
        model = add_lora(model)
        trainable, total = param_counts(model)
        engine = zerolaunch.initialize(model, ds_config(row, args.micro_batch), device=device)

        def step(batch):
            loss = engine(**batch).loss
            engine.backward(loss)
            engine.step()
            return loss

        def state():
            return {k: v.detach().float().cpu().clone() for k, v in engine.consolidated_state_dict().items()}

    elif row.startswith("ds-"):
        import deepspeed
        from transformers.integrations import HfDeepSpeedConfig

        cfg = ds_config(row, args.micro_batch)
        keep = HfDeepSpeedConfig(cfg)  # noqa: F841  (alive while the model is built: zero.Init)
        model = Seeded._from_config(config, dtype=bf16)
        # zero.Init partitioned each param as its module was built, before HF's init ran on the (empty)
        # partitions: gather module by module and draw the same seeded values as the other rows
        for module in model.modules():
            own = list(module.parameters(recurse=False))
            with deepspeed.zero.GatheredParameters(own, modifier_rank=0, enabled=bool(own)):
                model._init_weights(module)
        model = add_lora(model)
        trainable, total = _ds_counts(model)
        engine, _, _, _ = deepspeed.initialize(
            model=model, model_parameters=[p for p in model.parameters() if p.requires_grad], config=cfg
        )

        def step(batch):
            loss = engine(**batch).loss
            engine.backward(loss)
            engine.step()
            return loss

        def state():
            out = {}
            for name, p in engine.module.named_parameters():
                with deepspeed.zero.GatheredParameters([p]):
                    out[name] = p.detach().float().cpu().clone()
            return out

    elif row in ("fsdp2", "fsdp2-offp"):
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

        with torch.device("meta"):
            model = Seeded._from_config(config, dtype=bf16)
        model = add_lora(model)
        trainable, total = param_counts(model)
        for p in model.parameters():  # accelerate: fp32 master for what trains, the frozen base as loaded
            if p.requires_grad:
                p.data = p.data.float()
        kw = {"mp_policy": MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=torch.float32)}
        base = model.get_base_model()
        groups = [(layer,) for layer in base.model.layers] + [(base.get_input_embeddings(),)]
        last = (base.model.norm, base.get_output_embeddings())
        if row == "fsdp2":
            model.to_empty(device=device)
            _init_module_tree(model)
            for (module,) in groups:
                fully_shard(module, **kw)
            fully_shard(list(last), **kw, reshard_after_forward=False)
        else:
            kw["offload_policy"] = CPUOffloadPolicy(pin_memory=device.type == "cuda")
            _fsdp2_offload_build(model, [*groups, last], kw, device)
        fully_shard(model, **kw)
        step = plain_step(model, fused=device.type == "cuda")

        def state():
            return {k: v.full_tensor().detach().float().cpu().clone() for k, v in model.state_dict().items()}

    else:
        raise SystemExit(f"unknown row {row!r}; choose from {', '.join(ROWS)}")
    return step, state, {"trainable_params": trainable, "total_params": total}


def _fsdp2_offload_build(model, groups, kw, device) -> None:
    """fsdp2-offp: each group (a decoder layer; the embedding; the final norm with lm_head) made real on the
    device, initialized and fully_shard-ed with CPUOffloadPolicy, whose FSDPParam moves the shard to (pinned)
    host memory, before the next: the GPU never holds the base. What is left on meta (the rotary buffers) is
    made real last; the caller wraps the root."""
    import torch
    from torch.distributed.fsdp import fully_shard

    for group in groups:
        for module in group:
            module.to_empty(device=device)
        _init_module_tree(model, group)
        fully_shard(list(group) if len(group) > 1 else group[0], **kw, reshard_after_forward=len(group) == 1)
    base = model.get_base_model()
    for module in model.modules():
        if any(t.is_meta for t in [*module.parameters(recurse=False), *module.buffers(recurse=False)]):
            module.to_empty(device=device, recurse=False)
            with torch.no_grad():
                base._init_weights(module)


def _ds_counts(model) -> tuple[int, int]:
    """param_counts under zero.Init, whose params hold their full shape in ds_shape."""
    trainable = total = 0
    for p in model.parameters():
        n = p.ds_numel if hasattr(p, "ds_numel") else p.numel()
        total += n
        trainable += n if p.requires_grad else 0
    return trainable, total


class HostPeak:
    """Peak host memory of this process: VmHWM (peak resident, shared pages included) from the kernel, and the
    peak of RssAnon (private memory: what the process itself allocated) sampled every 50 ms."""

    def __init__(self):
        self.rss_anon_peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def status_kib(key: str) -> int:
        try:
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith(key + ":"):
                        return int(line.split()[1])
        except OSError:
            pass
        return 0

    def _run(self):
        while not self._stop.wait(0.05):
            self.rss_anon_peak = max(self.rss_anon_peak, self.status_kib("RssAnon"))

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.rss_anon_peak = max(self.rss_anon_peak, self.status_kib("RssAnon"))


def run_row(row: str, args) -> dict:
    import torch

    device = torch.device(args.device)
    cuda = device.type == "cuda"
    init_single_rank_group(device)
    with HostPeak() as host:
        t0 = time.perf_counter()
        step, _, info = build_row(row, args, device)
        build_s = time.perf_counter() - t0
        vocab = SIZES[args.size]["vocab_size"]
        g = torch.Generator().manual_seed(1234)
        n = args.warmup + args.steps
        data = torch.randint(0, vocab, (n, args.micro_batch, args.seq_len), generator=g)
        times, losses = [], []
        step_peak = step_peak_base = 0
        for i, ids in enumerate(data):
            batch = {"input_ids": ids.to(device), "labels": ids.to(device)}  # HF shifts the labels itself
            if cuda and i == args.warmup:
                torch.cuda.synchronize()
                step_peak_base = torch.cuda.max_memory_allocated()
                torch.cuda.reset_peak_memory_stats()
            t = time.perf_counter()
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
            loss = step(batch)
            if cuda:
                end.record()
                torch.cuda.synchronize()
            ms = start.elapsed_time(end) if cuda else 1e3 * (time.perf_counter() - t)
            losses.append(float(loss.detach().float()))
            if i >= args.warmup:
                times.append(ms)
    if cuda:
        step_peak = torch.cuda.max_memory_allocated()
        run_peak = max(step_peak, step_peak_base)
    step_ms = statistics.median(times) if times else None
    tokens = args.micro_batch * args.seq_len
    return {
        "row": row,
        "size": args.size,
        "layers": getattr(args, "layers", None),
        "seq_len": args.seq_len,
        "micro_batch": args.micro_batch,
        "step_ms": step_ms,
        "step_ms_all": times,
        "tok_s": tokens / (step_ms / 1e3) if step_ms else None,
        "peak_gpu_gib": run_peak / 2**30 if cuda else None,
        "peak_gpu_step_gib": step_peak / 2**30 if cuda else None,
        "peak_host_hwm_gib": HostPeak.status_kib("VmHWM") / 2**20,
        "peak_host_rss_anon_gib": host.rss_anon_peak / 2**20,
        "build_s": build_s,
        "first_loss": losses[0] if losses else None,
        "final_loss": losses[-1] if losses else None,
        "losses": losses,
        **info,
        "torch": torch.__version__,
        "card": torch.cuda.get_device_name(0) if cuda else "cpu",
    }


def drive(args) -> None:
    rows = pick_rows(args.rows, ROWS)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    results = []
    for row in rows:
        cmd = [sys.executable, __file__, "--one", row, *sys.argv[1:]]
        t0 = time.time()
        try:
            results.append(row_result(cmd, args.timeout))
        except RuntimeError as e:
            results.append({"row": row, "size": args.size, "error": str(e)[-600:]})
        results[-1]["wall_s"] = time.time() - t0
        print(
            json.dumps({k: v for k, v in results[-1].items() if k not in ("losses", "step_ms_all")}),
            flush=True,
        )
        (out_dir / f"lora-{args.size}{f'-{args.layers}l' if args.layers else ''}.json").write_text(
            json.dumps(results, indent=1)
        )
    print(table(results))


def table(results: list[dict]) -> str:
    ok = [r for r in results if "error" not in r and r.get("step_ms")]
    best = {
        off: min((r["step_ms"] for r in ok if r["row"] in peers), default=None)
        for off, peers in PEERS.items()
    }
    lines = [
        f"{'row':<11} {'step ms':>9} {'tok/s':>8} {'GPU GiB':>8} {'host GiB':>9} {'loss':>8} {'x best peer':>11}"
    ]
    for r in results:
        if "error" in r:
            lines.append(f"{r['row']:<11} failed: {r['error'][:100]}")
            continue
        ref = best[r["row"].endswith("-offp")]
        ratio = f"{r['step_ms'] / ref:.3f}x" if ref and r.get("step_ms") else "-"
        gpu = f"{r['peak_gpu_gib']:.2f}" if r.get("peak_gpu_gib") is not None else "-"
        ms = f"{r['step_ms']:.1f}" if r.get("step_ms") else "-"
        tok = f"{r['tok_s']:.0f}" if r.get("tok_s") else "-"
        lines.append(
            f"{r['row']:<11} {ms:>9} {tok:>8} {gpu:>8} {r['peak_host_hwm_gib']:>9.2f} "
            f"{r['final_loss']:>8.4f} {ratio:>11}"
        )
    lines.append(
        "host GiB: VmHWM (peak resident, pinned buffers included; the JSON has the sampled RssAnon too); "
        "GPU GiB: peak allocated over the whole run, build included"
    )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="zl-z3,ds-z3,fsdp2", help=f"comma list of: {', '.join(ROWS)}; or all")
    ap.add_argument("--size", choices=tuple(SIZES), default="8b")
    ap.add_argument("--tiny", action="store_true", help="--size tiny (the smoke test)")
    ap.add_argument(
        "--layers",
        type=int,
        help="decoder layers instead of the size's (34b at 64 layers: 44.8e9 params, 83.5 GiB in bf16, more "
        "than an 80 GB card holds; at its 48 layers the bf16 base is 62.8 GiB)",
    )
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--micro-batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=5, help="timed steps (median reported)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--out", default="bench/results/lora")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per row")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.tiny:
        args.size = "tiny"
    if args.one:
        print_result(run_row(args.one, args))
    else:
        drive(args)


if __name__ == "__main__":
    main()
