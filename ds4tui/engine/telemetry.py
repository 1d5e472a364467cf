"""GPU and process memory telemetry for the memory pane (spec platform.md §3).

A backend turns one source of numbers into a :class:`MemorySample`; the UI polls
:meth:`MemoryBackend.sample` from a worker (2–4 Hz) and keeps the samples in a
:class:`MemoryHistory`.  Every byte value is an ``int`` number of bytes, and a value the
source does not give is ``None``, never 0.  :meth:`MemoryBackend.sample` does not raise on
a source that fails: the affected values read ``None`` and ``note`` says why.

Backends:

- :class:`SysfsBackend`: amdgpu's ``/sys/class/drm/cardN/device/mem_info_*`` files and
  ``gpu_busy_percent`` (kernel ``Documentation/gpu/amdgpu/driver-misc.rst`` and
  ``Documentation/gpu/amdgpu/thermal.rst``).  On an APU such as Strix Halo the model lives in
  GTT and VRAM is the BIOS carve-out: the two pools are shown side by side, never summed.
- :class:`NvmlBackend`: NVIDIA's NVML through ``pynvml`` (the ``nvidia-ml-py`` distribution,
  optional; https://docs.nvidia.com/deploy/nvml-api/).
- :class:`RssBackend`: the process's resident set size and the host's total memory from
  ``/proc`` (``man 5 proc``), for the CPU engine or when no GPU source is found.
- :class:`FakeBackend`: replays a script of samples (UI and unit tests).
- :class:`NoneBackend`: no telemetry; every value ``None`` and the reason in ``note``.

:func:`select_backend` picks one: ``DS4TUI_TELEMETRY`` or an explicit request first, then by
the engine backend.  Nothing here imports the UI.
"""

from __future__ import annotations

import atexit
import dataclasses
import errno
import os
import re
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from ds4tui.engine.errors import TelemetryUnavailable

__all__ = [
    "BACKEND_NAMES",
    "APU_NOTE",
    "MemorySample",
    "MemoryBackend",
    "TelemetryUnavailable",
    "SysfsBackend",
    "NvmlBackend",
    "RssBackend",
    "FakeBackend",
    "NoneBackend",
    "pressure_script",
    "select_backend",
    "MemoryHistory",
    "format_bytes",
]

#: The values ``DS4TUI_TELEMETRY`` and ``select_backend(requested=...)`` accept.
BACKEND_NAMES = ("fake", "sysfs", "nvml", "rss", "none")

#: The note every amdgpu sample carries (spec platform.md §3.1, ROCm issue #6004).
APU_NOTE = ("on APUs (Strix Halo) the model lives in GTT and VRAM is the BIOS carve-out: "
            "the two pools are not to be summed")


@dataclass(frozen=True)
class MemorySample:
    """One reading of one memory source.

    All ``*_b`` fields are ``int`` bytes, ``busy_pct`` an ``int`` percentage (0–100);
    ``None`` means the source does not give the value (or could not be read), never 0.

    - ``t_mono_s``: ``time.monotonic()`` seconds when the sample was taken.
    - ``backend``: ``"sysfs"``, ``"nvml"``, ``"rss"``, ``"fake"`` or ``"none"``.
    - ``device``: e.g. ``"amdgpu card1 (0000:c3:00.0)"``, the NVML device name, ``"process"``.
    - ``vram_total_b``/``vram_used_b``: device memory (on an APU: the BIOS carve-out).
    - ``gtt_total_b``/``gtt_used_b``: amdgpu's GTT pool (system memory the GPU maps; on an
      APU this is where the model lives).  Not to be added to VRAM.
    - ``rss_b``: the process's resident set size; ``host_total_b``: the host's ``MemTotal``.
    - ``busy_pct``: GPU busy percentage (amdgpu ``gpu_busy_percent``, NVML utilization ``gpu``).
    - ``note``: one line for the pane: caveats and the reason for any ``None``.
    - ``vis_vram_total_b``/``vis_vram_used_b``: the CPU-visible (BAR) part of VRAM (amdgpu).
    - ``runtime_free_b``/``runtime_total_b``: the GPU runtime's view (``hipMemGetInfo`` /
      ``cudaMemGetInfo``), filled by the engine, not by these backends; shown as "HIP's view".
    """

    t_mono_s: float
    backend: str
    device: str
    vram_total_b: int | None = None
    vram_used_b: int | None = None
    gtt_total_b: int | None = None
    gtt_used_b: int | None = None
    rss_b: int | None = None
    busy_pct: int | None = None
    note: str = ""
    host_total_b: int | None = None
    vis_vram_total_b: int | None = None
    vis_vram_used_b: int | None = None
    runtime_free_b: int | None = None
    runtime_total_b: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The fields as a plain dict (JSON-ready: floats, ints, strings and ``None``)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, t_mono_s: float | None = None) -> "MemorySample":
        """Build a sample from a dict of its fields.

        ``backend`` and ``device`` default to ``"fake"``; a missing ``t_mono_s`` takes the
        ``t_mono_s`` argument (or ``time.monotonic()``).  An unknown key raises ``ValueError``.
        """
        unknown = set(d) - _FIELDS
        if unknown:
            raise ValueError(f"unknown MemorySample fields: {sorted(unknown)}")
        kw = dict(d)
        kw.setdefault("backend", "fake")
        kw.setdefault("device", "fake")
        if "t_mono_s" not in kw:
            kw["t_mono_s"] = time.monotonic() if t_mono_s is None else t_mono_s
        return cls(**kw)


_FIELDS = frozenset(f.name for f in dataclasses.fields(MemorySample))


class MemoryBackend:
    """A source of :class:`MemorySample`.

    ``name`` is the backend's name (:data:`BACKEND_NAMES`).  :meth:`available` says whether
    it gives numbers here, :meth:`why_unavailable` why not (one line, ``""`` when
    available).  :meth:`sample` never raises for a failing source: an unavailable backend
    returns a sample with every value ``None`` and the reason in ``note``.  :meth:`close`
    releases file descriptors or libraries and may be called more than once; backends are
    also context managers.  ``sample`` may be called from a worker thread.
    """

    name = "none"

    def available(self) -> bool:
        return False

    def why_unavailable(self) -> str:
        return ""

    def sample(self) -> MemorySample:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def _empty(self, device: str, note: str) -> MemorySample:
        return MemorySample(t_mono_s=time.monotonic(), backend=self.name, device=device, note=note)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# --------------------------------------------------------------------------------- sysfs

_CARD_RE = re.compile(r"card(\d+)")
_BDF_RE = re.compile(r"[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]")

# The amdgpu files read per sample, in MemorySample field order.
_SYSFS_FILES = (
    ("vram_total_b", "mem_info_vram_total"),
    ("vram_used_b", "mem_info_vram_used"),
    ("gtt_total_b", "mem_info_gtt_total"),
    ("gtt_used_b", "mem_info_gtt_used"),
    ("vis_vram_total_b", "mem_info_vis_vram_total"),
    ("vis_vram_used_b", "mem_info_vis_vram_used"),
    ("busy_pct", "gpu_busy_percent"),
)


def _amdgpu_cards(root: Path) -> list[tuple[int, Path]]:
    """``(N, root/cardN)`` for every ``cardN`` under ``root`` whose ``device/driver`` resolves
    to a directory named ``amdgpu``, by N.  Connector entries (``cardN-DP-1``) are skipped."""
    try:
        names = os.listdir(root)
    except OSError:
        return []
    cards = []
    for name in names:
        m = _CARD_RE.fullmatch(name)
        if m and os.path.basename(os.path.realpath(root / name / "device" / "driver")) == "amdgpu":
            cards.append((int(m.group(1)), root / name))
    return sorted(cards)


def _pci_bdf(card: Path) -> str | None:
    """The card's PCI address (``0000:c3:00.0``): ``PCI_SLOT_NAME`` of ``device/uevent``, else
    the name the ``device`` link resolves to; ``None`` when neither gives one."""
    try:
        for line in (card / "device" / "uevent").read_text().splitlines():
            if line.startswith("PCI_SLOT_NAME="):
                return line.split("=", 1)[1].strip()
    except OSError:
        pass
    base = os.path.basename(os.path.realpath(card / "device"))
    return base if _BDF_RE.fullmatch(base) else None


def _read_int_file(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


class SysfsBackend(MemoryBackend):
    """amdgpu memory from sysfs: ``<root>/cardN/device/mem_info_*`` and ``gpu_busy_percent``.

    Source: kernel ``Documentation/gpu/amdgpu/driver-misc.rst`` (``mem_info_vram_total``,
    ``mem_info_vram_used``, ``mem_info_vis_vram_*``, ``mem_info_gtt_total``,
    ``mem_info_gtt_used``: plain integers in bytes, from ``amdgpu_vram_mgr.c`` and
    ``amdgpu_gtt_mgr.c``) and ``thermal.rst`` (``gpu_busy_percent``, a percentage from the SMU).

    A card is a ``cardN`` directory (not a ``cardN-DP-1`` connector) whose ``device/driver``
    resolves to ``amdgpu``.  ``card`` picks one by ``"card1"``, ``"1"`` or PCI address
    (``"0000:c3:00.0"``); without it the card with the largest GTT total is used (the lowest
    N on a tie).  A card named by ``card`` that is missing or not amdgpu makes the backend
    unavailable.

    Each file is kept open and read with one ``os.pread``.  A file that is missing reads
    ``None``; one that raises (``EPERM``/``ENODEV`` while the GPU is runtime-suspended,
    ``EACCES``, ...) or holds no integer reads ``None``, is named in ``note``, and is reopened
    on the next sample.  Every sample's ``note`` carries :data:`APU_NOTE`.
    """

    name = "sysfs"

    def __init__(self, root: Path | str = Path("/sys/class/drm"), card: str | None = None):
        self.root = Path(root)
        self.card_path: Path | None = None
        self.device = "amdgpu"
        self._reason = ""
        self._fds: dict[str, int] = {}
        self._lock = threading.Lock()
        cards = _amdgpu_cards(self.root)
        if card is not None:
            want = str(card)
            want_n = int(want[4:] if want.startswith("card") else want) if re.fullmatch(r"(card)?\d+", want) else None
            for n, path in cards:
                if n == want_n or _pci_bdf(path) == want:
                    self.card_path = path
            if self.card_path is None:
                self._reason = f"no amdgpu card {want!r} under {self.root}"
        elif cards:
            # Largest GTT total wins; max() keeps the first (lowest N) of equal keys.
            self.card_path = max(cards, key=lambda c: _read_int_file(c[1] / "device" / "mem_info_gtt_total") or -1)[1]
        else:
            self._reason = f"no amdgpu card under {self.root}"
        if self.card_path is not None:
            bdf = _pci_bdf(self.card_path)
            self.device = f"amdgpu {self.card_path.name}" + (f" ({bdf})" if bdf else "")

    def available(self) -> bool:
        return self.card_path is not None

    def why_unavailable(self) -> str:
        return self._reason

    def _read(self, fname: str) -> tuple[int | None, str]:
        """``(value, problem)``: ``problem`` is ``""``, or a few words when the file exists but
        could not be read as an integer.  Called with the lock held."""
        fd = self._fds.get(fname)
        try:
            if fd is None:
                fd = os.open(self.card_path / "device" / fname, os.O_RDONLY | os.O_CLOEXEC)
                self._fds[fname] = fd
            raw = os.pread(fd, 64, 0)
        except OSError as e:
            self._drop(fname)
            if e.errno == errno.ENOENT:
                return None, ""
            return None, f"{fname}: {errno.errorcode.get(e.errno) or type(e).__name__}"
        try:
            return int(raw.strip()), ""
        except ValueError:
            self._drop(fname)
            return None, f"{fname}: not an integer"

    def _drop(self, fname: str) -> None:
        fd = self._fds.pop(fname, None)
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass

    def sample(self) -> MemorySample:
        if self.card_path is None:
            return self._empty(self.device, self._reason)
        values: dict[str, int | None] = {}
        problems = []
        with self._lock:
            for field, fname in _SYSFS_FILES:
                values[field], problem = self._read(fname)
                if problem:
                    problems.append(problem)
        note = APU_NOTE + ("; unreadable: " + ", ".join(problems) if problems else "")
        return MemorySample(t_mono_s=time.monotonic(), backend=self.name, device=self.device, note=note, **values)

    def close(self) -> None:
        with self._lock:
            for fname in list(self._fds):
                self._drop(fname)


# ---------------------------------------------------------------------------------- NVML

def _nvml_error_value(e: BaseException) -> Any:
    return getattr(e, "value", None)


class NvmlBackend(MemoryBackend):
    """NVIDIA GPU memory through NVML (``pynvml`` from the ``nvidia-ml-py`` distribution).

    Source: NVML API reference (https://docs.nvidia.com/deploy/nvml-api/),
    ``nvmlDeviceGetMemoryInfo`` / ``nvmlDeviceGetMemoryInfo_v2`` and
    ``nvmlDeviceGetUtilizationRates``.

    ``pynvml`` is imported and ``nvmlInit`` called on first use (:meth:`available` or
    :meth:`sample`); a failed import, a failed ``nvmlInit``, no device, or no device
    ``index`` make the backend unavailable with the reason.  Memory comes from
    ``nvmlDeviceGetMemoryInfo(h, version=nvmlMemory_v2)``: ``vram_used_b`` is v2 ``used``,
    which excludes the driver-reserved memory (``reserved``, named in ``note``;
    ``cudaMemGetInfo`` total = ``total - reserved``).  Only when the binding or the driver
    does not support v2 does it fall back to v1, whose ``used`` includes the reserved memory,
    and ``note`` says so.  GTT fields are ``None``; ``busy_pct`` is utilization ``gpu``
    (``None`` when NVML refuses).  :meth:`close` calls ``nvmlShutdown`` once (also at exit).
    """

    name = "nvml"

    def __init__(self, index: int = 0):
        self.index = index
        self.device = f"nvml device {index}"
        self._nvml: Any = None
        self._handle: Any = None
        self._state = "new"  # new -> ready | failed -> closed
        self._reason = ""
        self._v2 = True
        self._v1_reason = ""
        self._lock = threading.Lock()

    def _init(self) -> None:
        """Import and initialise NVML once.  Called with the lock held."""
        if self._state != "new":
            return
        try:
            import pynvml
        except Exception as e:  # ImportError, or a broken install
            self._fail(f"pynvml not importable (pip install nvidia-ml-py): {e}")
            return
        try:
            pynvml.nvmlInit()
        except Exception as e:  # NVMLError: driver or library missing
            self._fail(f"nvmlInit failed: {e}")
            return
        try:
            count = pynvml.nvmlDeviceGetCount()
            if count <= self.index:
                raise LookupError(f"no NVML device {self.index} ({count} found)")
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(self.index)
            name = pynvml.nvmlDeviceGetName(self._handle)
            self.device = name.decode(errors="replace") if isinstance(name, bytes) else str(name)
        except Exception as e:
            try:
                pynvml.nvmlShutdown()
            except Exception:
                pass
            self._fail(str(e) if isinstance(e, LookupError) else f"NVML device {self.index}: {e}")
            return
        self._nvml = pynvml
        self._state = "ready"
        atexit.register(self.close)

    def _fail(self, reason: str) -> None:
        self._state = "failed"
        self._reason = reason

    def available(self) -> bool:
        with self._lock:
            self._init()
            return self._state == "ready"

    def why_unavailable(self) -> str:
        with self._lock:
            self._init()
            if self._state == "closed":
                return "NVML closed"
            return self._reason

    def _memory(self) -> tuple[Any, str]:
        """``(memory info or None, note)``.  Called with the lock held."""
        nv = self._nvml
        if self._v2 and hasattr(nv, "nvmlMemory_v2"):
            try:
                mem = nv.nvmlDeviceGetMemoryInfo(self._handle, version=nv.nvmlMemory_v2)
                return mem, f"NVML memory v2: used excludes the {format_bytes(int(mem.reserved))} the driver reserves"
            except TypeError:
                self._v1_reason = "NVML binding has no memory v2"
            except nv.NVMLError as e:
                if _nvml_error_value(e) not in {getattr(nv, n, object()) for n in (
                        "NVML_ERROR_FUNCTION_NOT_FOUND", "NVML_ERROR_NOT_SUPPORTED",
                        "NVML_ERROR_ARGUMENT_VERSION_MISMATCH")}:
                    return None, f"memory info: {e}"
                self._v1_reason = f"driver does not support NVML memory v2 ({e})"
            self._v2 = False
        elif self._v2:
            self._v1_reason = "NVML binding has no memory v2"
            self._v2 = False
        try:
            mem = nv.nvmlDeviceGetMemoryInfo(self._handle)
        except nv.NVMLError as e:
            return None, f"memory info: {e}"
        return mem, f"{self._v1_reason}: NVML memory v1, used includes the memory the driver reserves"

    def sample(self) -> MemorySample:
        with self._lock:
            self._init()
            if self._state != "ready":
                return self._empty(self.device, self._reason or "NVML closed")
            mem, note = self._memory()
            try:
                busy = int(self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu)
            except self._nvml.NVMLError:
                busy = None
        return MemorySample(
            t_mono_s=time.monotonic(), backend=self.name, device=self.device,
            vram_total_b=None if mem is None else int(mem.total),
            vram_used_b=None if mem is None else int(mem.used),
            busy_pct=busy, note=note,
        )

    def close(self) -> None:
        with self._lock:
            if self._state == "ready":
                try:
                    self._nvml.nvmlShutdown()
                except Exception:
                    pass
                atexit.unregister(self.close)
            self._state = "closed"
            self._handle = None


# ----------------------------------------------------------------------------------- RSS

class RssBackend(MemoryBackend):
    """The process's resident memory and the host's total memory, from ``/proc`` (``man 5 proc``).

    ``rss_b`` = the second field of ``<proc_root>/<pid>/statm`` (resident pages, ``self`` when
    ``pid`` is ``None``) × ``os.sysconf("SC_PAGE_SIZE")``; ``host_total_b`` = ``MemTotal`` of
    ``<proc_root>/meminfo`` (kB) × 1024.  VRAM, GTT and ``busy_pct`` are ``None``.  ``note``
    (e.g. why there is no GPU telemetry) starts every sample's note.  Unavailable when
    ``statm`` cannot be read (no ``/proc``, or the process is gone).
    """

    name = "rss"

    def __init__(self, pid: int | None = None, *, proc_root: Path | str = Path("/proc"), note: str = ""):
        self.pid = pid
        self.proc_root = Path(proc_root)
        self.note = note
        self.device = "process" if pid is None else f"process {pid}"
        self._statm = self.proc_root / ("self" if pid is None else str(pid)) / "statm"
        self._page = os.sysconf("SC_PAGE_SIZE")
        self._host_total: int | None = None

    def _rss(self) -> tuple[int | None, str]:
        try:
            fields = self._statm.read_text().split()
            return int(fields[1]) * self._page, ""
        except (OSError, ValueError, IndexError) as e:
            return None, f"{self._statm}: {e.strerror if isinstance(e, OSError) and e.strerror else e!r}"

    def _host(self) -> int | None:
        if self._host_total is None:
            try:
                with open(self.proc_root / "meminfo") as f:
                    for line in f:
                        if line.startswith("MemTotal:"):
                            parts = line.split()
                            scale = 1024 if len(parts) > 2 and parts[2] == "kB" else 1
                            self._host_total = int(parts[1]) * scale
                            break
            except (OSError, ValueError, IndexError):
                pass
        return self._host_total

    def available(self) -> bool:
        return self._rss()[0] is not None

    def why_unavailable(self) -> str:
        return self._rss()[1]

    def sample(self) -> MemorySample:
        rss, problem = self._rss()
        note = "; ".join(s for s in (self.note, problem) if s)
        return MemorySample(t_mono_s=time.monotonic(), backend=self.name, device=self.device,
                            rss_b=rss, host_total_b=self._host(), note=note)


# ------------------------------------------------------------------------- fake and none

class FakeBackend(MemoryBackend):
    """Replays ``samples`` (a list, or any iterable such as a generator) of
    :class:`MemorySample` or dicts (:meth:`MemorySample.from_dict`; a dict without
    ``t_mono_s`` is stamped with ``time.monotonic()`` when it is sampled), one per
    :meth:`sample`, repeating the last one once the script is exhausted.  An empty script
    raises ``ValueError``.  Always available.
    """

    name = "fake"

    def __init__(self, samples: Iterable[MemorySample | Mapping[str, Any]]):
        self._it = iter(samples)
        self._next = next(self._it, None)
        if self._next is None:
            raise ValueError("FakeBackend needs at least one sample")
        self._last: MemorySample | None = None
        self._lock = threading.Lock()

    def available(self) -> bool:
        return True

    def sample(self) -> MemorySample:
        with self._lock:
            item = self._next
            if item is None:
                return self._last
            self._next = next(self._it, None)
            s = item if isinstance(item, MemorySample) else MemorySample.from_dict(item)
            self._last = s
            return s


def pressure_script(n: int = 60, *, gtt_total_b: int = 133143986176, start_b: int = 2 << 30,
                    end_b: int | None = None, vram_total_b: int = 512 << 20) -> list[dict[str, Any]]:
    """A fake APU script for :class:`FakeBackend`: GTT use rising linearly from ``start_b`` to
    ``end_b`` (default 97 % of ``gtt_total_b``) over ``n`` samples, a constant 512 MiB
    carve-out, busy 0→100 %.  Dicts without ``t_mono_s`` (stamped when sampled)."""
    end_b = int(gtt_total_b * 0.97) if end_b is None else end_b
    steps = max(n - 1, 1)
    return [
        dict(backend="fake", device="fake APU (pressure)", vram_total_b=vram_total_b,
             vram_used_b=vram_total_b // 4, gtt_total_b=gtt_total_b,
             gtt_used_b=start_b + (end_b - start_b) * i // steps, busy_pct=100 * i // steps, note=APU_NOTE)
        for i in range(n)
    ]


class NoneBackend(MemoryBackend):
    """No telemetry: every sample has all values ``None`` and ``reason`` as its note.
    :meth:`available` is ``False`` and :meth:`why_unavailable` gives ``reason``."""

    name = "none"

    def __init__(self, reason: str = "memory telemetry is off"):
        self.reason = reason

    def why_unavailable(self) -> str:
        return self.reason

    def sample(self) -> MemorySample:
        return self._empty("none", self.reason)


# ---------------------------------------------------------------------------- selection

def select_backend(requested: str | None = None, *, engine_backend: str = "cpu",
                   env: Mapping[str, str] | None = None,
                   drm_root: Path | str = Path("/sys/class/drm"),
                   proc_root: Path | str = Path("/proc")) -> MemoryBackend:
    """The telemetry backend to poll.

    1. ``requested``, else ``env["DS4TUI_TELEMETRY"]`` (empty counts as unset; ``env`` is a
       mapping the caller passes, None = none: the process environment is read at the command
       line's edge, which passes ``DS4TUI_TELEMETRY`` as ``requested``): one of
       :data:`BACKEND_NAMES`.  An unknown name raises ``ValueError``; a named backend that
       is unavailable here raises :class:`TelemetryUnavailable` with its reason (``"none"``
       always succeeds; ``"fake"`` replays :func:`pressure_script`).
    2. Otherwise by ``engine_backend`` (``"cpu"``, ``"reference"``, ``"hip"``): the CPU
       engines get :class:`RssBackend`; ``"hip"`` gets :class:`SysfsBackend` when an amdgpu
       card is present, else :class:`NvmlBackend` when NVML works, else :class:`RssBackend`
       whose note says why there is no GPU telemetry.  When even ``/proc`` cannot be read,
       :class:`NoneBackend` with the reason.  An unknown ``engine_backend`` raises ``ValueError``.

    ``drm_root`` and ``proc_root`` point the sysfs and ``/proc`` backends elsewhere (tests).
    """
    name = (requested or (env or {}).get("DS4TUI_TELEMETRY") or "").strip().lower()
    if name:
        if name not in BACKEND_NAMES:
            raise ValueError(f"unknown telemetry backend {name!r}: choose one of {', '.join(BACKEND_NAMES)}")
        if name == "none":
            return NoneBackend()
        if name == "fake":
            return FakeBackend(pressure_script())
        backend: MemoryBackend = {
            "sysfs": lambda: SysfsBackend(drm_root),
            "nvml": lambda: NvmlBackend(),
            "rss": lambda: RssBackend(proc_root=proc_root),
        }[name]()
        if not backend.available():
            reason = backend.why_unavailable()
            backend.close()
            raise TelemetryUnavailable(f"{name} telemetry unavailable: {reason}")
        return backend

    if engine_backend not in ("cpu", "reference", "hip"):
        raise ValueError(f"unknown engine backend {engine_backend!r}: choose one of cpu, reference, hip")
    note = ""
    if engine_backend == "hip":
        sysfs = SysfsBackend(drm_root)
        if sysfs.available():
            return sysfs
        nvml = NvmlBackend()
        if nvml.available():
            return nvml
        note = f"no GPU telemetry: {sysfs.why_unavailable()}; NVML: {nvml.why_unavailable()}"
        nvml.close()
    rss = RssBackend(proc_root=proc_root, note=note)
    if rss.available():
        return rss
    return NoneBackend("; ".join(s for s in (note, f"no process telemetry: {rss.why_unavailable()}") if s))


# ------------------------------------------------------------------------------ history

class MemoryHistory:
    """The last ``maxlen`` samples, oldest first; safe to append from one thread and read
    from another."""

    def __init__(self, maxlen: int = 120):
        if maxlen < 1:
            raise ValueError("maxlen must be at least 1")
        self.maxlen = maxlen
        self._ring: deque[MemorySample] = deque(maxlen=maxlen)
        self._lock = threading.Lock()

    def append(self, sample: MemorySample) -> None:
        with self._lock:
            self._ring.append(sample)

    def snapshot(self) -> list[MemorySample]:
        """A copy of the samples, oldest first."""
        with self._lock:
            return list(self._ring)

    def latest(self) -> MemorySample | None:
        with self._lock:
            return self._ring[-1] if self._ring else None

    def series(self, field: str) -> list[Any]:
        """One field of every sample, oldest first (``None`` where a sample lacks it), for a
        sparkline.  An unknown field raises ``ValueError``."""
        if field not in _FIELDS:
            raise ValueError(f"unknown MemorySample field {field!r}")
        with self._lock:
            return [getattr(s, field) for s in self._ring]

    def clear(self) -> None:
        with self._lock:
            self._ring.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._ring)


# ------------------------------------------------------------------------------ format

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def plural(n: int, word: str) -> str:
    """``"1 thread"``, ``"2 threads"``: ``n`` and ``word`` with an ``s`` unless ``n`` is 1."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def format_bytes(n: int | None) -> str:
    """``n`` bytes in binary units: ``"512 B"``, ``"12.5 KiB"``, ``"512.0 MiB"``, ``"1.23 GiB"``
    (one decimal below GiB, two from GiB up); ``"—"`` for ``None``."""
    if n is None:
        return "—"
    sign = "-" if n < 0 else ""
    v = float(abs(n))
    for i, unit in enumerate(_UNITS):
        if i == 0 and v < 1024:
            return f"{sign}{int(v)} B"
        digits = 2 if i >= 3 else 1
        if i > 0 and (round(v, digits) < 1024 or i == len(_UNITS) - 1):
            return f"{sign}{v:.{digits}f} {unit}"
        v /= 1024
    raise AssertionError("unreachable")
