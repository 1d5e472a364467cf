"""The memory plan of a hip engine: does the model fit the GPU memory this machine gives it?

Checked before the engine uploads anything (``gpu.admit``, called by ``Engine`` when it opens a
model on the hip backend), so that a model that cannot fit is refused in a second with the numbers
and what to change, instead of failing with out-of-memory minutes into an 80 GB upload.

The budget (spec platform.md §2.2, §3.1):

- **AMD** (amdgpu in sysfs): on an APU such as Strix Halo the GPU allocates from GTT, system memory
  that the kernel's TTM lets the GPU map, capped by ``ttm.pages_limit`` (by default half of RAM:
  about 62 GiB on a 128 GB machine); VRAM is the BIOS carve-out.  The budget is the larger of the
  two pools' free bytes (``mem_info_gtt_total - mem_info_gtt_used``, the same for VRAM), never
  their sum.  ``hipMemGetInfo`` is not used there: on APUs it has been reported to give free >
  total.  When GTT is what limits, the error names ``ttm.pages_limit`` with the number of pages
  that leaves :data:`OS_RESERVE` of RAM to the system.
- **NVIDIA** (and AMD without sysfs): the runtime's free bytes from the probe
  (``cudaMemGetInfo`` / ``hipMemGetInfo``), unless they are not plausible (free > total).

The model needs its tensor bytes (the support model's too) plus :data:`WORKING_RESERVE` for what
is allocated after the weights (a session's KV and compressor state, activations, staging).
:func:`gtt_report` is what ``ds4tui doctor`` prints: the GTT limit and whether it is the kernel's
default half of RAM.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path

from ds4tui.engine.errors import DeviceMemoryError
from ds4tui.engine.layout import CSA_RATIO

GIB = 1 << 30
#: TTM counts its limit in pages of this size (ttm.pages_limit x 4096 = the GTT bytes).
PAGE = 4096
#: Bytes a model needs beyond its tensors: the KV and compressor state of a session at a few
#: thousand tokens, activations and the planar upload's staging chunk.  A GPU session's default
#: 2048-token passes (session.DEFAULT_BATCH) take about 2.4 GiB of it on DS4 Flash (activations
#: of ~0.8 MiB per row, the raw KV and compressor rings one pass long; spec ds4.md §2.8) and the
#: prefill GEMM's buffers at most 0.31 GiB more (:func:`gemm_bytes`).
WORKING_RESERVE = 4 * GIB
#: RAM the suggested ttm.pages_limit leaves to the operating system and the host side.
OS_RESERVE = 2 * GIB
#: A GTT total within this fraction of half of MemTotal is taken for the kernel's default.
DEFAULT_TOLERANCE = 0.02

SYSFS_DRM = Path("/sys/class/drm")
PROC = Path("/proc")
TTM_PARAMS = Path("/sys/module/ttm/parameters")


def _gib(b: int | None) -> str:
    return "?" if b is None else f"{b / GIB:.1f} GiB"


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def ram_total(proc_root: Path = PROC) -> int | None:
    """``MemTotal`` of ``proc_root/meminfo`` in bytes (None when unreadable)."""
    try:
        for line in (proc_root / "meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                parts = line.split()
                return int(parts[1]) * (1024 if len(parts) > 2 and parts[2] == "kB" else 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


@dataclass(frozen=True)
class GTTInfo:
    """amdgpu's memory pools and the TTM limit, as sysfs and ``/proc/meminfo`` give them (bytes;
    None for what could not be read)."""

    card: str
    gtt_total: int | None
    gtt_used: int | None
    vram_total: int | None
    vram_used: int | None
    ram_total: int | None
    pages_limit: int | None  # /sys/module/ttm/parameters/pages_limit (0 or None: the default)
    page_pool_size: int | None

    @property
    def default_half(self) -> bool | None:
        """Whether the GTT total is the kernel's default, half of RAM (None when unknown)."""
        if not self.gtt_total or not self.ram_total:
            return None
        return abs(self.gtt_total - self.ram_total / 2) <= DEFAULT_TOLERANCE * self.ram_total / 2

    def suggested_pages(self) -> int | None:
        """A ``ttm.pages_limit`` that gives GTT all of RAM but :data:`OS_RESERVE`, in whole GiB
        (32505856 pages, 124 GiB, on a 128 GB Strix Halo with 126 GiB of MemTotal)."""
        if not self.ram_total:
            return None
        gib = (self.ram_total - OS_RESERVE) // GIB
        return int(gib * GIB // PAGE) if gib > 0 else None

    def advice(self) -> str:
        """The kernel command line parameters that raise the GTT limit ("" when RAM is unknown)."""
        pages = self.suggested_pages()
        if not pages:
            return ""
        return (f"add `ttm.pages_limit={pages} ttm.page_pool_size={pages}` to the kernel command line "
                f"({pages * PAGE / GIB:.0f} GiB of GTT = pages x {PAGE} bytes) and reboot")

    def to_json(self) -> dict:
        d = asdict(self)
        d["default_half"] = self.default_half
        d["suggested_pages_limit"] = self.suggested_pages()
        return d


def read_gtt(sysfs_root: Path = SYSFS_DRM, proc_root: Path = PROC, ttm_root: Path = TTM_PARAMS) -> GTTInfo | None:
    """The amdgpu card with the largest GTT (telemetry.SysfsBackend's choice), or None without one."""
    from ds4tui.engine.telemetry import SysfsBackend

    with SysfsBackend(sysfs_root) as be:
        if not be.available():
            return None
        s = be.sample()
    return GTTInfo(card=s.device, gtt_total=s.gtt_total_b, gtt_used=s.gtt_used_b, vram_total=s.vram_total_b,
                   vram_used=s.vram_used_b, ram_total=ram_total(proc_root),
                   pages_limit=_read_int(ttm_root / "pages_limit"), page_pool_size=_read_int(ttm_root / "page_pool_size"))


def gtt_report(sysfs_root: Path = SYSFS_DRM, proc_root: Path = PROC, ttm_root: Path = TTM_PARAMS) -> dict:
    """What ``ds4tui doctor`` prints about the GTT limit: the pools, RAM, the TTM parameters, whether
    the limit is the default half of RAM, and the parameters that raise it."""
    g = read_gtt(sysfs_root, proc_root, ttm_root)
    if g is None:
        return {"card": None, "note": f"no amdgpu card under {sysfs_root}"}
    d = g.to_json()
    if g.default_half:
        d["note"] = (f"GTT is the kernel's default, half of the {_gib(g.ram_total)} of RAM: a model larger than "
                     f"{_gib(g.gtt_total)} will not load; to raise it, {g.advice()}")
    elif g.default_half is False:
        d["note"] = f"GTT {_gib(g.gtt_total)} of {_gib(g.ram_total)} RAM (raised from the default half)"
    else:
        d["note"] = "GTT or RAM total unreadable"
    return d


@dataclass(frozen=True)
class Plan:
    """A model's bytes against a device's budget (bytes); ``budget`` None: no usable numbers."""

    need: int
    weights: int
    reserve: int
    budget: int | None
    source: str
    detail: str
    apu: bool = False  # budget from an integrated GPU's GTT and VRAM pools

    @property
    def fits(self) -> bool:
        return self.budget is None or self.need <= self.budget


def tensor_bytes(model, support=None) -> int:
    """The bytes the engine uploads: every tensor of the model and of a support model (an opened
    model, or a path: then its file size)."""
    total = 0
    for m in (model, support):
        if m is None:
            continue
        if isinstance(m, (str, os.PathLike)):
            total += os.path.getsize(m)
        else:
            total += sum(int(t.nbytes) for t in m.tensors.values())
    return total


def draft_vocab_bytes(model, support, rows: int) -> int:
    """Bytes the engine adds for a draft vocabulary of ``rows`` ids (spec dspark.md §2.6): one row of
    the target's LM head (``output.weight``) and of the support model's Markov W2 and W1 per id,
    copied at attach (``draft_vocab`` in native/engine.c) and uploaded with the support model.
    ``model`` and ``support`` are opened models; 0 when ``rows`` is 0 or ``support`` is None."""
    if not rows or support is None:
        return 0
    per_row = 0
    head = model.tensors.get("output.weight")
    if head is not None:
        per_row += int(head.nbytes) // int(model.config.n_vocab)
    for spec in support.specs:
        t = support.tensors.get(spec.name)
        if t is not None and spec.name.endswith(("markov_w1.weight", "markov_w2.weight")):
            per_row += int(t.nbytes) // int(spec.shape[0])
    return int(rows) * per_row


def plan(weights: int, info, gtt: GTTInfo | None = None, reserve: int = WORKING_RESERVE) -> Plan:
    """The plan for ``weights`` bytes on the device of ``info`` (a :class:`ds4tui.engine.gpu.GPUInfo`).
    With ``gtt`` on a HIP device, amdgpu's pools: an integrated GPU (APU) gets the larger of the GTT
    and VRAM pools' free bytes, a discrete one its VRAM's.  Otherwise the runtime's free bytes."""
    need = weights + reserve
    if info.platform == "hip" and gtt is not None and (gtt.gtt_total or gtt.vram_total):
        free = {name: (tot or 0) - (used or 0) for name, tot, used in
                (("GTT", gtt.gtt_total, gtt.gtt_used), ("VRAM", gtt.vram_total, gtt.vram_used))}
        if info.integrated:
            pool = max(free, key=free.get)
            default = " (the kernel's default: half of RAM)" if gtt.default_half else ""
            detail = (f"{gtt.card}: GTT {_gib(gtt.gtt_total)}{default} with {_gib(free['GTT'])} free, VRAM (the "
                      f"BIOS carve-out) {_gib(gtt.vram_total)} with {_gib(free['VRAM'])} free; RAM {_gib(gtt.ram_total)}")
        else:
            pool = "VRAM"
            detail = f"{gtt.card}: VRAM {_gib(gtt.vram_total)} with {_gib(free['VRAM'])} free"
        return Plan(need, weights, reserve, max(free[pool], 0), f"amdgpu {pool} (sysfs)", detail, bool(info.integrated))
    name = "CUDA" if info.platform == "cuda" else "HIP"
    if info.mem_total and info.mem_free <= info.mem_total:
        detail = (f"device {info.device} ({info.device_name}): the {name} runtime reports {_gib(info.mem_free)} free "
                  f"of {_gib(info.mem_total)}")
        return Plan(need, weights, reserve, int(info.mem_free), f"{name} runtime", detail)
    return Plan(need, weights, reserve, None, f"{name} runtime",
                f"the {name} runtime's numbers are not usable ({info.mem_free} free of {info.mem_total} bytes)")


def misfit(what: str, p: Plan, gtt: GTTInfo | None = None) -> DeviceMemoryError | None:
    """The error for a plan that does not fit (None when it fits), naming the numbers and what to set."""
    if p.fits:
        return None
    head = (f"{what}: the model needs {_gib(p.need)} of GPU memory ({_gib(p.weights)} of weights, support model "
            f"included, + {_gib(p.reserve)} for the KV cache and working buffers), but {p.detail}: at most "
            f"{_gib(p.budget)} in one pool")
    advice = ""
    if p.apu and gtt is not None:
        usable = (gtt.ram_total or 0) - OS_RESERVE
        if gtt.ram_total and p.need > usable:
            tail = f". This machine's {_gib(gtt.ram_total)} of RAM cannot hold it at any GTT limit"
        elif gtt.default_half or (gtt.gtt_total or 0) < p.need:
            advice = gtt.advice()
            tail = f". Raise the GTT limit: {advice} (README: Strix Halo)" if advice else ""
        else:
            tail = (f". GTT is large enough ({_gib(gtt.gtt_total)}) but {_gib(gtt.gtt_used)} of it is in use: "
                    f"close the programs that hold it")
    else:
        tail = ". Free device memory or use a smaller model"
    return DeviceMemoryError(head + tail + "; nothing was uploaded", need=p.need, budget=int(p.budget or 0),
                             source=p.source, advice=advice)


def check(model, support, info, *, draft_vocab_extra: int = 0, sysfs_root: Path = SYSFS_DRM, proc_root: Path = PROC,
          ttm_root: Path = TTM_PARAMS) -> DeviceMemoryError | None:
    """The memory plan of ``model`` (+ ``support``, + ``draft_vocab_extra`` bytes of draft-vocabulary
    row copies: :func:`draft_vocab_bytes`) on the device of ``info``: None when it fits (or the
    budget is unknown), else the :class:`DeviceMemoryError` to raise."""
    gtt = read_gtt(sysfs_root, proc_root, ttm_root) if info.platform == "hip" else None
    p = plan(tensor_bytes(model, support) + draft_vocab_extra, info, gtt)
    return misfit(str(getattr(model, "path", model)), p, gtt)


# ---- will it fit: the whole plan at a context size (``ds4tui inspect --ctx N [--budget SIZE]``) -----

#: Tokens a session evaluates in one pass by default (``Engine.session(n_batch=)``; spec ds4.md
#: §2.8): DEFAULT_BATCH on the CPU, GPU_DEFAULT_BATCH on a GPU.
DEFAULT_BATCH = 256
GPU_DEFAULT_BATCH = 2048
#: DS4_PASS_TILE_ROWS (internal.h): attention, indexer and LM-head scratch is sized for this many rows.
PASS_TILE_ROWS = 256
#: DS4_DSPARK_MAX_BLOCK: the key buffers hold at least this many rows.
_MAX_BLOCK = 16
#: DS4_GRAPH_MAX_ROWS: the largest pass whose greedy picks run on the device.
GRAPH_MAX_ROWS = _MAX_BLOCK + 1


#: hip/gemm.hip's GM_TILE_ELEMS: 16-bit weights the prefill GEMM dequantises at a time.
GEMM_TILE_ELEMS = 64 << 20
#: hip/gemm.hip's GM_CHUNK_ROWS: slot rows an expert product's chunk holds (or its largest count).
GEMM_CHUNK_ROWS = 8192
#: DS4_PREFILL_GEMM_MIN_ROWS (ds4_engine.h): passes of fewer rows never take the prefill GEMM.
PREFILL_GEMM_MIN_ROWS = 32
#: What a GPU context allocates once (hip/gpu_internal.h): the q8 rows of a short pass quantised once
#: (GPU_Q8_PRE_BYTES: two regions of 8 rows of 32768 codes, their scales and 16-code sums) and the
#: greedy picks' parts (ARGMAX_SCRATCH_BYTES: 17 rows x 64 parts x value, index, non-finite index).
GPU_CONTEXT_BYTES = 2 * 8 * (32768 + 32768 // 32 * 4 + 32768 // 16 * 4) + GRAPH_MAX_ROWS * 64 * 3 * 4


def gemm_bytes(specs, n_rows: int, n_expert_used: int, o_groups: int = 1) -> int:
    """The most device memory the prefill GEMM's scratch buffers take (bytes; spec platform.md §7.1,
    hip/gemm.hip) after passes of at most ``n_rows`` tokens over the weight matrices among ``specs``
    (``TensorSpec`` with ``c_bind == "mat"``, shapes [rows, cols] or [experts, rows, cols]), every one
    counted as if the GEMM took it (an upper bound); 0 below ``PREFILL_GEMM_MIN_ROWS``.  The buffers
    grow to their largest request and no further: the dequantised tile (dense: whole rows up to
    GEMM_TILE_ELEMS weights; a gather: whole matrices, as many as that holds), the activations rounded
    to 16 bits (dense: the pass's rows; a gather: one chunk of at most max(GEMM_CHUNK_ROWS, n_rows)
    slot rows), a gather's float32 results (one chunk) and its slot lists (the used matrices' ids and
    two int32 a padded slot row).  The gathers are the routed experts (``n_rows * n_expert_used``
    slots; the padding of the whole product at most a tile's matrices times the largest count, which
    is at most ``n_rows``) and the grouped attention output ``attn_output_a`` (``o_groups`` matrices of
    ``n_rows`` slots each, no padding).  The BLAS library's own workspace is not counted."""
    if n_rows < PREFILL_GEMM_MIN_ROWS:
        return 0
    w = x = y = lists = 0

    def gather(experts: int, rows: int, cols: int, slots: int, padding: bool) -> None:
        nonlocal w, x, y, lists
        per = max(1, min(experts, GEMM_TILE_ELEMS // (rows * cols)))  # matrices a tile
        padded = slots + (per * n_rows if padding else 0)
        chunk = min(max(GEMM_CHUNK_ROWS, n_rows), padded)
        w = max(w, per * rows * cols * 2)
        x = max(x, chunk * cols * 2)
        y = max(y, chunk * rows * 4)
        lists = max(lists, (min(experts, slots) + 2 * padded) * 4)

    for s in specs:
        if s.c_bind != "mat":
            continue
        if len(s.shape) == 2:
            rows, cols = s.shape
            w = max(w, max(1, min(rows, GEMM_TILE_ELEMS // cols)) * cols * 2)
            x = max(x, n_rows * cols * 2)
            if o_groups > 1 and s.name.endswith("attn_output_a.weight"):
                gather(o_groups, rows // o_groups, cols, o_groups * n_rows, padding=False)
        elif len(s.shape) == 3:
            experts, rows, cols = s.shape
            gather(experts, rows, cols, n_rows * n_expert_used, padding=True)
    return w + x + y + lists


@dataclass(frozen=True)
class SupportShape:
    """What a DSpark support model adds to a session's buffers: its stages, block, Markov rank and
    the number of captured target layers (spec dspark.md §4.1)."""

    n_stages: int
    block: int
    rank: int
    n_capture: int


def session_bytes(c, n_ctx: int, *, n_batch: int | None = None, support: SupportShape | None = None,
                  host: bool = False, n_threads: int = 1) -> dict[str, int]:
    """Bytes a session of ``n_ctx`` tokens allocates for the model of config ``c``
    (:class:`ds4tui.engine.layout.DS4Config`), as the engine's ``ds4_state_init`` does
    (``ds4tui/native/forward.c``; spec ds4.md §2.4 for the compressor shapes): ``kv`` the raw KV rows
    of every layer (the sliding window plus one pass: it does not grow with the context),
    ``compressor`` the compressor and indexer state plus the compressed rows (n_ctx / ratio + 1 per
    compressed layer: what grows with the context), ``scratch`` the activations and buffers of a
    pass of min(``n_batch``, ``n_ctx``) + 1 tokens (``n_batch`` None: the backend's default,
    :data:`DEFAULT_BATCH` with ``host``, else :data:`GPU_DEFAULT_BATCH`), the attention and indexer
    scores and the logits (per thread with ``host``; on a GPU per token and head of one tile of
    :data:`PASS_TILE_ROWS` rows) and the drafter's buffers with ``support`` — all of these
    in the backend's memory (the GPU's on hip) — and ``host``, the session's buffers in host memory
    (the logits and the sampler's, the DSpark cycle's).  All float32 / int32.  The engine's
    ``Session.memory().scratch`` is ``scratch + host`` plus the engine's float32 vector copies
    (:func:`vector_bytes`)."""
    F4 = 4

    def buf(n: int) -> int:
        return max(int(n) * F4, 4)  # the engine allocates 4 bytes for an empty buffer

    L = c.n_layer
    ratios = tuple(c.compress_ratios[:L])
    if n_batch is None:
        n_batch = DEFAULT_BATCH if host else GPU_DEFAULT_BATCH
    B = min(n_batch, n_ctx) + 1
    if support is not None and B < support.block:
        B = support.block
    max_ratio = max(ratios, default=0)
    min_ratio = min((r for r in ratios if r), default=0)
    H, HC, D, NH, ID = c.n_embd, c.hc_count, c.head_dim, c.n_head, c.indexer_head_dim
    IH, K, E, V, W = c.indexer_n_head, c.n_expert_used, c.n_expert, c.n_vocab, c.sliding_window
    FS = c.n_ff_shexp
    kv_cap, cmp_cap = W + B, 2 * max_ratio + B
    kv = L * buf(kv_cap * D)
    comp = 0
    for r in ratios:
        if not r:
            continue
        csa = r == CSA_RATIO  # the compressed-sparse layers also keep the indexer's state
        cw, n_rows = (2 if csa else 1) * D, n_ctx // r + 1
        comp += 2 * buf(cmp_cap * cw) + buf(n_rows * D)
        if csa:
            comp += 2 * buf(cmp_cap * 2 * ID) + buf(n_rows * ID)
    n_comp = n_ctx // min_ratio + 1 if min_ratio else 1
    # keys per (token, head): the window, then at most top_k selected rows of a CSA layer or every
    # compressed row of an HCA layer, at least the drafter's block
    keys_comp = max([_MAX_BLOCK] + [min(c.indexer_top_k, n_ctx // r + 1) if r == CSA_RATIO else n_ctx // r + 1
                                    for r in ratios if r])
    keys_cap = W + keys_comp
    keys_cap += keys_cap & 1
    FF, cwmax = max(c.n_ff_exp, FS), 2 * max(D, ID)
    T = min(B, PASS_TILE_ROWS)
    att = (n_threads * 4 * keys_cap) if host else (T * NH * keys_cap)
    isc = (n_threads * 2 * n_comp) if host else (T * n_comp)
    # the first buffer: the pass's position word (two int32, read by replayed graphs) and its tokens
    counts = [B + 2, *(B * HC * H,) * 3, B * c.hc_mix, B * HC, B * HC, B * HC * HC, B * H, B * H, B * c.q_lora_rank,
              B * NH * D, B * D, B * NH * D, B * c.o_groups * c.o_lora_rank, B * H, B * cwmax, B * cwmax,
              B * IH * ID, B * IH, B * c.indexer_top_k, B, isc, B * E, B * K, B * K, B * K * FF, B * K * FF,
              B * K * H, B * max(FS, 1), B * max(FS, 1), B * H, B * H, B * HC, B * HC, 1 if host else T * V, att, B * c.o_groups]
    if not host:
        counts.append(2 * GRAPH_MAX_ROWS)  # the greedy picks on the device: ids, then the non-finite flags
    if support is not None:
        s = support
        counts += [kv_cap * s.n_capture * H, s.n_stages * kv_cap * D, W * H, W * D, s.n_stages * s.block * D,
                   s.block * H, s.block * V, V, max(s.rank, 1), _MAX_BLOCK]
    scratch = sum(buf(n) for n in counts)
    host_b = V * (F4 + 16)  # the logits row and the sampler's buffer
    if support is not None:
        s = support
        host_b += F4 * (2 * s.block * H + H + s.rank + s.block * V + (s.block + 1) * V) + V * (4 + 8)
        if not host:
            host_b += s.block * V * F4  # the drafter's logits, copied back from the device
    return {"kv": kv, "compressor": comp, "scratch": scratch, "host": host_b}


def vector_bytes(specs) -> int:
    """Bytes of the float32 copies the engine keeps of the vectors and small tables among
    ``specs`` (``TensorSpec`` with ``c_bind == "vec"``: norms, biases, HC bases)."""
    total = 0
    for s in specs:
        if s.c_bind == "vec":
            n = 1
            for d in s.shape:
                n *= d
            total += 4 * n
    return total


@dataclass(frozen=True)
class FitPlan:
    """The memory a model needs at ``n_ctx`` tokens (bytes), against ``budget`` (None: unknown)."""

    n_ctx: int
    weights: int
    support: int
    kv: int
    compressor: int
    scratch: int
    budget: int | None
    budget_source: str
    max_ctx: int | None  # the largest context that fits the budget (None: unknown or none fits)
    context_length: int
    gemm: int = 0  # the prefill GEMM's buffers at most (gemm_bytes)

    @property
    def need(self) -> int:
        """Bytes the plan needs in all: weights, support, KV, compressor state, scratch and the
        prefill GEMM's buffers."""
        return self.weights + self.support + self.kv + self.compressor + self.scratch + self.gemm

    @property
    def fits(self) -> bool | None:
        """Whether :attr:`need` is within the budget (bytes); None when the budget is unknown."""
        return None if self.budget is None else self.need <= self.budget

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(need=self.need, fits=self.fits)
        return d


def fit_plan(config, n_ctx: int, *, weights: int, support_bytes: int = 0, support: SupportShape | None = None,
             fixed_scratch: int = 0, budget: int | None = None, budget_source: str = "",
             n_batch: int | None = None, specs=None) -> FitPlan:
    """The plan of a model (``config``, ``weights`` tensor bytes) with a support model
    (``support_bytes``, its ``support`` shape) on a GPU at ``n_ctx`` tokens: weights, support, the
    session's KV, compressor state and scratch (:func:`session_bytes`; ``fixed_scratch`` adds what
    does not depend on the context, the float32 vector copies, and the GPU context's own
    :data:`GPU_CONTEXT_BYTES` are added), with ``specs`` (the model's ``TensorSpec`` list) the
    prefill GEMM's buffers at most (:func:`gemm_bytes`, passes of the session's batch), against
    ``budget`` bytes, with the largest context (up to the model's context length) whose plan fits."""
    def at(n: int) -> dict[str, int]:
        b = session_bytes(config, n, n_batch=n_batch, support=support)
        b["scratch"] += fixed_scratch + GPU_CONTEXT_BYTES
        rows = min(GPU_DEFAULT_BATCH if n_batch is None else n_batch, n) + 1
        b["gemm"] = gemm_bytes(specs, rows, config.n_expert_used, config.o_groups) if specs is not None else 0
        return b

    def need(n: int) -> int:
        b = at(n)
        return weights + support_bytes + b["kv"] + b["compressor"] + b["scratch"] + b["gemm"]

    limit = int(config.context_length)
    max_ctx = None
    if budget is not None and need(1) <= budget:
        lo, hi = 1, limit  # the plan grows with the context: the largest n with need(n) <= budget
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if need(mid) <= budget:
                lo = mid
            else:
                hi = mid - 1
        max_ctx = lo
    b = at(n_ctx)
    return FitPlan(n_ctx=n_ctx, weights=weights, support=support_bytes, kv=b["kv"], compressor=b["compressor"],
                   scratch=b["scratch"], budget=budget, budget_source=budget_source, max_ctx=max_ctx,
                   context_length=limit, gemm=b["gemm"])


def gpu_budget(sysfs_root: Path = SYSFS_DRM, proc_root: Path = PROC, ttm_root: Path = TTM_PARAMS,
               probe=None) -> tuple[int | None, str]:
    """The GPU memory a model can have on this machine (bytes) and where the number comes from:
    amdgpu's larger pool (GTT or VRAM, never their sum; on Strix Halo the GTT that
    ``ttm.pages_limit`` sets) from sysfs, else the GPU runtime's total (``probe()``, default
    :func:`ds4tui.engine.gpu.probe`); (None, why) when no size is known: no GPU, a native engine or
    GPU library that cannot be used, or a runtime that gives no total."""
    g = read_gtt(sysfs_root, proc_root, ttm_root)
    if g is not None and (g.gtt_total or g.vram_total):
        pools = {"GTT": g.gtt_total or 0, "VRAM": g.vram_total or 0}
        pool = max(pools, key=pools.get)
        return pools[pool], f"amdgpu {pool} total of {g.card} (sysfs)"
    if probe is None:
        from ds4tui.engine.gpu import probe
    info, why = probe(None)
    if not why and info is not None:
        name = "CUDA" if info.platform == "cuda" else "HIP"
        device = f"device {info.device} ({info.device_name})"
        if info.mem_total:
            return int(info.mem_total), f"the {name} runtime's total of {device}"
        why = f"the {name} runtime found {device} but gives no memory total for it"
    return None, f"no GPU memory size known: {why or 'no memory numbers'}; give --budget SIZE"
