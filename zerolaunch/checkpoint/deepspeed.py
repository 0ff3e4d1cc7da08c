"""Reading DeepSpeed ZeRO checkpoints (stages 1/2/3, any world size, fp32 or bf16) without DeepSpeed.

Produces exactly the tensors DeepSpeed's own `zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint`
does (buffers cast to fp32 when floating, frozen params, fp32 master of trainable params, tied aliases
from `shared_params`), tensor by tensor; plus the frozen params of stage-1 checkpoints, which zero_to_fp32
silently drops (stage 1 records no frozen_param_shapes). Layout facts (DeepSpeed 0.19.8, see /work/shared/PEERS.md):
- stages 1/2: per param group, the ranks' `single_partition_of_fp32_groups[g]` concatenate into the
  group's flat vector; params follow in `param_shapes[g]` order, each followed by its entry of
  `param_alignment_paddings[g]` when present; the group is padded to a multiple of 2*world_size.
- stage 3: every param is split on its own, ceil(numel / world) elements per rank; a rank's flat groups
  concatenate (in param order over all groups) into its shard; frozen params likewise, per rank, in
  `frozen_param_fragments` of each rank's model-states file.

The files are pickles holding DeepSpeed objects (LossScaler, ZeroStageEnum, fragment_address). They are
loaded with `torch.load(weights_only=True, mmap=True)` and an allow-list of inert stand-ins registered
under those names, so no code from the file ever runs and DeepSpeed need not be installed.
"""

from __future__ import annotations

import enum
import math
import pickle
import re
import zipfile
from pathlib import Path

import torch

from zerolaunch.checkpoint.errors import CheckpointError
from zerolaunch.checkpoint.outputs import OutTensor

_OPTIM = re.compile(r"^(bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt$")
_MODEL_STAGE3 = "zero_pp_rank_{r}_mp_rank_00_model_states.pt"
_MODEL = "mp_rank_00_model_states.pt"


class _Record:
    """Inert stand-in for a pickled DeepSpeed object: unpickling only fills its __dict__."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.__dict__})"


class ZeroStageEnum(enum.IntEnum):
    """Stand-in for deepspeed.runtime.zero.config.ZeroStageEnum (pickled as ZeroStageEnum(stage))."""

    disabled = 0
    optimizer_states = 1
    gradients = 2
    weights = 3
    max_stage = 4


def _record(name: str) -> type:
    return type(name, (_Record,), {})


_STAND_INS = [
    (ZeroStageEnum, "deepspeed.runtime.zero.config.ZeroStageEnum"),
    (_record("LossScaler"), "deepspeed.runtime.fp16.loss_scaler.LossScaler"),
    (_record("DynamicLossScaler"), "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler"),
    (_record("fragment_address"), "deepspeed.utils.tensor_fragment.fragment_address"),
]


def load_ds_file(path: Path) -> dict:
    """torch.load with weights_only=True, mmap=True and the DeepSpeed stand-ins allowed; errors name the file."""
    try:
        with torch.serialization.safe_globals(_STAND_INS):
            obj = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"missing DeepSpeed file {path}") from None
    except pickle.UnpicklingError as e:
        first = str(e).strip().splitlines()[-1] if str(e).strip() else ""
        raise CheckpointError(
            f"{path} holds pickled objects zerolaunch does not load (only tensors and "
            f"known DeepSpeed records are allowed): {first[:300]}"
        ) from None
    except (RuntimeError, zipfile.BadZipFile, EOFError, OSError, ValueError) as e:
        raise CheckpointError(f"{path} is truncated or corrupt: {str(e).splitlines()[0][:300]}") from None
    if not isinstance(obj, dict):
        raise CheckpointError(f"{path} is not a DeepSpeed checkpoint file (holds a {type(obj).__name__})")
    return obj


def _has_ds_files(folder: Path) -> bool:
    return folder.is_dir() and any(_OPTIM.match(p.name) for p in folder.iterdir())


def find_deepspeed_checkpoint(src: Path) -> Path | None:
    """The tag folder of a DeepSpeed checkpoint: `src` itself, `src/<latest>`, or src's only tag folder."""
    src = Path(src)
    if not src.is_dir():
        return None
    if _has_ds_files(src):
        return src
    latest = src / "latest"
    if latest.is_file():
        raw = latest.read_bytes()
        try:
            tag = raw.decode("utf-8").strip()
        except UnicodeDecodeError as e:
            if (src / "manifest.json").exists() or any(src.glob("step_*")):
                return None  # a zerolaunch root: its reader says what is wrong with `latest`
            tags = sorted(p.name for p in src.iterdir() if _has_ds_files(p))
            fix = (
                f"write the tag to use into it (one of {', '.join(tags)})"
                if tags
                else "write the tag into it"
            )
            raise CheckpointError(
                f"{latest} is not text (byte {e.start} is {raw[e.start : e.start + 1]!r}); it should hold the "
                f"name of a checkpoint tag folder in {src}: {fix}, or pass the tag folder itself"
            ) from None
        if _has_ds_files(src / tag):
            return src / tag
        if not (src / "manifest.json").exists() and not any(src.glob("step_*")):
            raise CheckpointError(
                f"{latest} names tag {tag!r}, but {src / tag} holds no "
                "*_optim_states.pt files; is the checkpoint complete?"
            )
        return None
    tags = sorted(p for p in src.iterdir() if _has_ds_files(p))
    if len(tags) > 1:
        raise CheckpointError(
            f"{src} holds several DeepSpeed checkpoints and no 'latest' file: "
            f"{[p.name for p in tags]}; pass the one to convert, e.g. {tags[-1]}"
        )
    return tags[0] if tags else None


def _numel(shape) -> int:
    return math.prod(int(d) for d in shape)


class DeepSpeedSource:
    """The consolidated fp32 weights of a DeepSpeed ZeRO checkpoint tag folder, one tensor at a time."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.description = f"DeepSpeed checkpoint {self.folder}"
        optim_files = self._optim_files()
        self.optim = [self._optimizer_state(p) for p in optim_files]
        osd = self.optim[0]
        if "zero_stage" not in osd or "partition_count" not in osd:
            raise CheckpointError(f"{optim_files[0]} is not a ZeRO optimizer state file (no zero_stage)")
        self.stage = int(osd["zero_stage"])
        count = osd["partition_count"]
        self.world_size = max(count) if isinstance(count, (list, tuple)) else int(count)
        if self.world_size != len(optim_files):
            raise CheckpointError(
                f"{self.folder}: the checkpoint was saved by {self.world_size} ranks but "
                f"holds {len(optim_files)} optimizer files; some rank files are missing"
            )
        if self.stage == 3:
            model_paths = [self.folder / _MODEL_STAGE3.format(r=r) for r in range(self.world_size)]
        elif self.stage in (1, 2):
            model_paths = [self.folder / _MODEL]
        else:
            raise CheckpointError(f"{optim_files[0]}: unsupported zero_stage {self.stage}")
        self.models = [load_ds_file(p) for p in model_paths]
        self.model_paths = model_paths
        for p, m in zip(model_paths, self.models, strict=True):
            if "buffer_names" not in m or "param_shapes" not in m:
                raise CheckpointError(f"{p} is not a DeepSpeed model-states file (no buffer_names)")
        self._plan()

    def _optim_files(self) -> list[Path]:
        found: dict[int, Path] = {}
        for p in self.folder.iterdir():
            m = _OPTIM.match(p.name)
            if not m:
                continue
            if int(m.group(3)) != 0:
                raise CheckpointError(
                    f"{p}: tensor/pipeline-parallel DeepSpeed checkpoints (mp_rank "
                    f"{m.group(3)}) are not supported; only data-parallel ZeRO"
                )
            found[int(m.group(2))] = p
        if not found:
            raise CheckpointError(f"{self.folder} holds no *_optim_states.pt files: not a ZeRO checkpoint")
        missing = [r for r in range(max(found) + 1) if r not in found]
        if missing:
            raise CheckpointError(
                f"{self.folder}: missing optimizer files of rank(s) {missing} "
                f"(have {sorted(p.name for p in found.values())})"
            )
        return [found[r] for r in range(len(found))]

    @staticmethod
    def _optimizer_state(path: Path) -> dict:
        d = load_ds_file(path)
        if not isinstance(d.get("optimizer_state_dict"), dict):
            raise CheckpointError(f"{path} has no optimizer_state_dict: not a DeepSpeed ZeRO optimizer file")
        return d["optimizer_state_dict"]

    def _plan(self) -> None:
        """Where each output tensor's elements live; shapes checked against the flat sizes like zero_to_fp32."""
        m0 = self.models[0]
        self._buffers = {k: v for k, v in m0["module"].items() if k in set(m0["buffer_names"])}
        self._frozen_shapes = dict(m0.get("frozen_param_shapes") or {})
        self._param_shapes = [dict(g) for g in m0["param_shapes"]]
        self._shared = dict(m0.get("shared_params") or {})
        key = "fp32_flat_groups" if self.stage == 3 else "single_partition_of_fp32_groups"
        try:
            self._flat = [list(osd[key]) for osd in self.optim]
        except KeyError:
            raise CheckpointError(
                f"{self.folder}: optimizer files lack {key!r} for stage {self.stage}"
            ) from None
        self._where: dict[str, tuple] = {}
        # Stage 1 records no frozen_param_shapes, and zero_to_fp32 then drops frozen params; the full
        # tensors are in `module` (stages 1/2 keep the whole model there), so they are read from it instead.
        self._frozen_in_module: dict[str, torch.Tensor] = {}
        if self.stage in (1, 2) and not self._frozen_shapes:
            trainable = {n for g in self._param_shapes for n in g}
            self._frozen_in_module = {
                n: t
                for n, t in m0["module"].items()
                if n not in trainable and n not in self._buffers and n not in self._shared
            }
        if self.stage == 3:
            self._plan_stage3()
        else:
            self._plan_stage12()

    def _plan_stage12(self) -> None:
        paddings = self.optim[0].get("param_alignment_paddings")
        align = 2 * self.world_size
        for g, shapes in enumerate(self._param_shapes):
            parts = [rank_groups[g] for rank_groups in self._flat]
            avail = sum(p.numel() for p in parts)
            pads = paddings[g] if paddings is not None else [0] * len(shapes)
            if len(pads) != len(shapes):
                raise CheckpointError(
                    f"{self.folder}: group {g} has {len(shapes)} params but {len(pads)} alignment paddings"
                )
            offset = 0
            for (name, shape), pad in zip(shapes.items(), pads, strict=True):
                self._where[name] = ("flat12", g, offset, tuple(shape))
                offset += _numel(shape) + int(pad)
            if align * math.ceil(offset / align) != align * math.ceil(avail / align):
                raise CheckpointError(
                    f"{self.folder}: param group {g} holds {avail} fp32 elements, its "
                    f"param_shapes need {offset}: the files do not belong together"
                )

    def _plan_stage3(self) -> None:
        offset = 0
        for shapes in self._param_shapes:
            for name, shape in shapes.items():
                self._where[name] = ("flat3", offset, tuple(shape))
                offset += math.ceil(_numel(shape) / self.world_size)
        avail = sum(t.numel() for t in self._flat[0])
        if offset != avail:
            raise CheckpointError(
                f"{self.folder}: each rank holds {avail} fp32 elements, the param_shapes "
                f"need {offset}: the files do not belong together"
            )

    def tensors(self):
        out = [
            OutTensor(n, tuple(t.shape), torch.float32 if t.is_floating_point() else t.dtype, n)
            for n, t in self._buffers.items()
        ]
        out += [OutTensor(n, tuple(s), torch.float32, n) for n, s in self._frozen_shapes.items()]
        out += [OutTensor(n, tuple(t.shape), torch.float32, n) for n, t in self._frozen_in_module.items()]
        out += [OutTensor(n, w[-1], torch.float32, n) for n, w in self._where.items()]
        known = {t.name: t for t in out}
        for alias, source in self._shared.items():
            if source in known:
                out.append(OutTensor(alias, known[source].shape, known[source].dtype, source))
        return out

    def read(self, name: str) -> torch.Tensor:
        if name in self._buffers:
            t = self._buffers[name]
            return (t.float() if t.is_floating_point() else t).clone()
        if name in self._frozen_shapes:
            return self._read_frozen(name)
        if name in self._frozen_in_module:
            return self._frozen_in_module[name].float().clone()
        where = self._where.get(name)
        if where is None:
            raise CheckpointError(f"{self.folder} holds no tensor {name!r}")
        if where[0] == "flat12":
            _, g, offset, shape = where
            return _slice_concat([r[g] for r in self._flat], offset, _numel(shape)).view(shape)
        _, offset, shape = where
        part = math.ceil(_numel(shape) / self.world_size)
        pieces = [_slice_concat(r, offset, part) for r in self._flat]
        return torch.cat(pieces)[: _numel(shape)].view(shape).clone()

    def _read_frozen(self, name: str) -> torch.Tensor:
        shape = tuple(self._frozen_shapes[name])
        frags = []
        for path, m in zip(self.model_paths, self.models, strict=True):
            f = (m.get("frozen_param_fragments") or {}).get(name)
            if f is None:
                raise CheckpointError(f"{path} lacks the fragment of frozen param {name!r}")
            frags.append(f.reshape(-1))
        return torch.cat(frags)[: _numel(shape)].float().view(shape).clone()

    def close(self) -> None:
        self.optim, self.models = [], []


def _slice_concat(parts: list[torch.Tensor], offset: int, numel: int) -> torch.Tensor:
    """Elements [offset, offset + numel) of the concatenation of `parts`, copying only those."""
    out = torch.empty(numel, dtype=torch.float32)
    pos, filled = 0, 0
    for p in parts:
        n = p.numel()
        lo, hi = max(offset, pos), min(offset + numel, pos + n)
        if lo < hi:
            out[filled : filled + hi - lo] = p.reshape(-1)[lo - pos : hi - pos]
            filled += hi - lo
        pos += n
    if filled != numel:
        raise CheckpointError(f"flat fp32 state too short: wanted [{offset}, {offset + numel}), have {pos}")
    return out
