"""ds4tui.engine.telemetry: sysfs, NVML, /proc, fake and none backends; selection; history; format."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import sys
import threading
import types
from pathlib import Path

import pytest

from ds4tui.engine import telemetry as tm
from ds4tui.engine.telemetry import (
    APU_NOTE,
    FakeBackend,
    MemoryHistory,
    MemorySample,
    NoneBackend,
    NvmlBackend,
    RssBackend,
    SysfsBackend,
    TelemetryUnavailable,
    format_bytes,
    pressure_script,
    select_backend,
)

PAGE = os.sysconf("SC_PAGE_SIZE")

# Strix Halo numbers (spec platform.md §3.1): 512 MiB carve-out, GTT = ttm.pages_limit × 4096.
HALO = {
    "mem_info_vram_total": "536870912\n",
    "mem_info_vram_used": "118358016\n",
    "mem_info_vis_vram_total": "536870912\n",
    "mem_info_vis_vram_used": "45056000\n",
    "mem_info_gtt_total": "133143986176\n",
    "mem_info_gtt_used": "87419027456\n",
    "gpu_busy_percent": "37\n",
}


def _card(root: Path, name: str, driver: str, files: dict[str, str], bdf: str) -> Path:
    """``root/drm/<name>`` with ``device`` -> ``root/devices/<bdf>`` and its ``driver`` ->
    ``root/drivers/<driver>``, as in the kernel's sysfs."""
    dev = root / "devices" / bdf
    dev.mkdir(parents=True)
    drv = root / "drivers" / driver
    drv.mkdir(parents=True, exist_ok=True)
    (dev / "driver").symlink_to(drv)
    for fname, text in files.items():
        (dev / fname).write_text(text)
    card = root / "drm" / name
    card.mkdir(parents=True)
    (card / "device").symlink_to(dev)
    return dev


@pytest.fixture
def sysfs(tmp_path) -> Path:
    """card0 = i915, card1 = amdgpu (Strix Halo), card1-DP-1 a connector; returns the drm root."""
    _card(tmp_path, "card0", "i915", {"mem_info_gtt_total": "999999999999999\n"}, "0000:00:02.0")
    _card(tmp_path, "card1", "amdgpu", HALO, "0000:c3:00.0")
    conn = tmp_path / "drm" / "card1-DP-1"
    conn.mkdir()
    (conn / "status").write_text("disconnected\n")
    (tmp_path / "drm" / "renderD128").mkdir()
    (tmp_path / "drm" / "version").write_text("drm 1.1.0 20060810\n")
    return tmp_path / "drm"


# ------------------------------------------------------------------------------- sample


def test_sample_defaults_none_and_to_dict_roundtrip():
    s = MemorySample(t_mono_s=1.5, backend="fake", device="x", gtt_used_b=7)
    d = s.to_dict()
    assert d["gtt_used_b"] == 7 and d["vram_total_b"] is None and d["rss_b"] is None and d["note"] == ""
    assert json.loads(json.dumps(d)) == d
    assert MemorySample.from_dict(d) == s
    with pytest.raises(ValueError, match="bogus"):
        MemorySample.from_dict({"bogus": 1})
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.gtt_used_b = 8  # type: ignore[misc]


# -------------------------------------------------------------------------------- sysfs


def test_sysfs_finds_amdgpu_card_and_parses_values(sysfs):
    with SysfsBackend(sysfs) as b:
        assert b.available() and b.why_unavailable() == ""
        assert b.card_path == sysfs / "card1"
        s = b.sample()
        assert s.backend == "sysfs"
        assert s.device == "amdgpu card1 (0000:c3:00.0)"
        assert s.vram_total_b == 536870912
        assert s.vram_used_b == 118358016
        assert s.gtt_total_b == 133143986176
        assert s.gtt_used_b == 87419027456
        assert s.vis_vram_total_b == 536870912
        assert s.vis_vram_used_b == 45056000
        assert s.busy_pct == 37
        assert s.rss_b is None and s.host_total_b is None
        assert s.note == APU_NOTE and "GTT" in s.note and "carve-out" in s.note
        assert isinstance(s.t_mono_s, float)
        # Values are re-read each sample through the kept-open fds.
        (sysfs / "card1" / "device" / "mem_info_gtt_used").write_text("90000000000\n")
        (sysfs / "card1" / "device" / "gpu_busy_percent").write_text("100\n")
        s2 = b.sample()
        assert s2.gtt_used_b == 90000000000 and s2.busy_pct == 100
        assert s2.t_mono_s >= s.t_mono_s
        assert len(b._fds) == 7
    assert b._fds == {}


def test_sysfs_uevent_gives_the_pci_address(tmp_path):
    dev = _card(tmp_path, "card0", "amdgpu", HALO, "weird-name")
    (dev / "uevent").write_text("DRIVER=amdgpu\nPCI_CLASS=38000\nPCI_SLOT_NAME=0000:65:00.0\n")
    with SysfsBackend(tmp_path / "drm") as b:
        assert b.sample().device == "amdgpu card0 (0000:65:00.0)"


def test_sysfs_missing_files_read_none(tmp_path):
    _card(tmp_path, "card0", "amdgpu", {"mem_info_gtt_total": "1024\n", "mem_info_gtt_used": "garbage\n"}, "0000:03:00.0")
    with SysfsBackend(tmp_path / "drm") as b:
        s = b.sample()
    assert s.gtt_total_b == 1024
    assert s.gtt_used_b is None and "mem_info_gtt_used: not an integer" in s.note
    assert s.vram_total_b is None and s.vram_used_b is None and s.busy_pct is None
    # Missing files are not errors: only the bad one is named.
    assert "mem_info_vram_total" not in s.note and "gpu_busy_percent" not in s.note


def test_sysfs_permission_and_suspend_errors_read_none_and_reopen(sysfs, monkeypatch):
    dev = sysfs / "card1" / "device"
    real_open, real_pread = os.open, os.pread
    fail = {"mem_info_vram_used": errno.EACCES, "gpu_busy_percent": errno.ENODEV}
    by_fd: dict[int, str] = {}
    opened: list[str] = []

    def fake_open(path, flags, *a):
        name = Path(path).name
        opened.append(name)
        if fail.get(name) == errno.EACCES:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        fd = real_open(path, flags, *a)
        by_fd[fd] = name
        return fd

    def fake_pread(fd, n, off):
        name = by_fd.get(fd)
        if fail.get(name) == errno.ENODEV:  # runtime-suspended GPU
            raise OSError(errno.ENODEV, "No such device")
        return real_pread(fd, n, off)

    if os.geteuid() != 0:
        (dev / "mem_info_vram_used").chmod(0)
        fail["mem_info_vram_used"] = None  # the real chmod does it
    monkeypatch.setattr(tm.os, "open", fake_open)
    monkeypatch.setattr(tm.os, "pread", fake_pread)

    b = SysfsBackend(sysfs)
    s = b.sample()
    assert s.vram_used_b is None and s.busy_pct is None
    assert s.vram_total_b == 536870912 and s.gtt_total_b == 133143986176 and s.gtt_used_b == 87419027456
    assert "mem_info_vram_used: EACCES" in s.note and "gpu_busy_percent: ENODEV" in s.note
    assert s.note.startswith(APU_NOTE)
    assert "gpu_busy_percent" not in b._fds and "mem_info_vram_used" not in b._fds

    # The GPU resumes and permissions are restored: the failed files are reopened, the good ones are not.
    fail.clear()
    if os.geteuid() != 0:
        (dev / "mem_info_vram_used").chmod(0o444)
    opened.clear()
    s2 = b.sample()
    assert sorted(opened) == ["gpu_busy_percent", "mem_info_vram_used"]
    assert s2.vram_used_b == 118358016 and s2.busy_pct == 37 and s2.note == APU_NOTE
    b.close()
    b.close()  # idempotent


def test_sysfs_picks_largest_gtt_unless_card_named(tmp_path):
    small = dict(HALO, mem_info_gtt_total="17179869184\n", gpu_busy_percent="1\n")
    _card(tmp_path, "card0", "amdgpu", small, "0000:03:00.0")
    _card(tmp_path, "card2", "amdgpu", HALO, "0000:c3:00.0")
    _card(tmp_path, "card1", "nouveau", {}, "0000:04:00.0")
    root = tmp_path / "drm"
    assert tm._amdgpu_cards(root) == [(0, root / "card0"), (2, root / "card2")]
    with SysfsBackend(root) as b:
        assert b.card_path == root / "card2" and b.sample().gtt_total_b == 133143986176
    for name in ("card0", "0", "0000:03:00.0"):
        with SysfsBackend(root, card=name) as b:
            assert b.card_path == root / "card0", name
            assert b.sample().gtt_total_b == 17179869184
    for name in ("card1", "card7", "0000:99:00.0"):
        b = SysfsBackend(root, card=name)
        assert not b.available()
        assert name in b.why_unavailable()
        s = b.sample()
        assert s.gtt_total_b is None and name in s.note


def test_sysfs_tie_on_gtt_takes_lowest_card(tmp_path):
    _card(tmp_path, "card3", "amdgpu", HALO, "0000:c4:00.0")
    _card(tmp_path, "card1", "amdgpu", HALO, "0000:c3:00.0")
    with SysfsBackend(tmp_path / "drm") as b:
        assert b.card_path.name == "card1"


def test_sysfs_no_amdgpu(tmp_path):
    assert not SysfsBackend(tmp_path / "nothing").available()
    _card(tmp_path / "other", "card0", "i915", {}, "0000:00:02.0")
    b = SysfsBackend(tmp_path / "other" / "drm")
    assert not b.available() and "no amdgpu card" in b.why_unavailable()
    s = b.sample()
    assert s.backend == "sysfs" and s.vram_total_b is None and s.gtt_total_b is None and "no amdgpu" in s.note


# ---------------------------------------------------------------------------------- RSS


def _proc(tmp_path, pid="self", statm="12345 678 90 12 0 3456 0\n",
          meminfo="MemTotal:       131072000 kB\nMemFree:         1000 kB\n") -> Path:
    root = tmp_path / "proc"
    (root / pid).mkdir(parents=True)
    if statm is not None:
        (root / pid / "statm").write_text(statm)
    if meminfo is not None:
        (root / "meminfo").write_text(meminfo)
    return root


def test_rss_backend_reads_statm_and_meminfo(tmp_path):
    root = _proc(tmp_path)
    b = RssBackend(proc_root=root)
    assert b.available() and b.why_unavailable() == ""
    s = b.sample()
    assert s.backend == "rss" and s.device == "process"
    assert s.rss_b == 678 * PAGE
    assert s.host_total_b == 131072000 * 1024
    assert s.vram_total_b is s.vram_used_b is s.gtt_total_b is s.gtt_used_b is s.busy_pct is None
    assert s.note == ""


def test_rss_backend_pid_note_and_gone_process(tmp_path):
    root = _proc(tmp_path, pid="4242", statm="1 2 3 4 5 6 7\n", meminfo=None)
    b = RssBackend(4242, proc_root=root, note="no GPU telemetry: test")
    s = b.sample()
    assert s.device == "process 4242" and s.rss_b == 2 * PAGE and s.host_total_b is None
    assert s.note == "no GPU telemetry: test"
    gone = RssBackend(999, proc_root=root)
    assert not gone.available() and "999" in gone.why_unavailable()
    s = gone.sample()
    assert s.rss_b is None and "999/statm" in s.note


def test_rss_backend_real_proc():
    if not Path("/proc/self/statm").exists():
        pytest.skip("no /proc")
    s = RssBackend().sample()
    assert s.rss_b > 1 << 20 and s.host_total_b > s.rss_b


# --------------------------------------------------------------------------- fake, none


def test_fake_backend_replays_and_repeats_last():
    a = MemorySample(t_mono_s=1.0, backend="fake", device="d", gtt_used_b=1)
    b = FakeBackend([a, {"gtt_used_b": 2, "t_mono_s": 2.0}, {"gtt_used_b": 3}])
    assert b.available()
    assert b.sample() is a
    s2 = b.sample()
    assert s2 == MemorySample(t_mono_s=2.0, backend="fake", device="fake", gtt_used_b=2)
    s3 = b.sample()
    assert s3.gtt_used_b == 3 and isinstance(s3.t_mono_s, float)
    assert b.sample() is s3 and b.sample() is s3


def test_fake_backend_generator_and_empty():
    b = FakeBackend({"busy_pct": i} for i in range(3))
    assert [b.sample().busy_pct for _ in range(5)] == [0, 1, 2, 2, 2]
    with pytest.raises(ValueError):
        FakeBackend([])


def test_pressure_script_rises_to_97_percent():
    script = pressure_script(11)
    gtt = [d["gtt_used_b"] for d in script]
    assert gtt[0] == 2 << 30 and gtt[-1] == int(133143986176 * 0.97)
    assert gtt == sorted(gtt)
    assert script[-1]["busy_pct"] == 100 and script[0]["vram_total_b"] == 512 << 20
    b = FakeBackend(script)
    assert b.sample().gtt_total_b == 133143986176


def test_none_backend():
    b = NoneBackend("telemetry is off here")
    assert not b.available() and b.why_unavailable() == "telemetry is off here"
    s = b.sample()
    assert s.backend == "none" and s.note == "telemetry is off here"
    assert all(v is None for k, v in s.to_dict().items() if k.endswith("_b") or k == "busy_pct")


# --------------------------------------------------------------------------------- NVML


class _NVMLError(Exception):
    def __init__(self, value):
        self.value = value
        super().__init__(f"NVML error {value}")


def _fake_pynvml(*, init_error=None, count=1, v2="ok", util_error=False):
    """A stand-in for ``pynvml`` (nvidia-ml-py) with H200 numbers from spec platform.md §3.4."""
    m = types.ModuleType("pynvml")
    m.NVMLError = _NVMLError
    m.NVML_ERROR_NOT_SUPPORTED = 3
    m.NVML_ERROR_FUNCTION_NOT_FOUND = 13
    m.NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
    m.NVML_ERROR_GPU_IS_LOST = 15
    m.nvmlMemory_v2 = 0x02000028
    m.calls = []

    def init():
        m.calls.append("init")
        if init_error is not None:
            raise _NVMLError(init_error)

    def get_memory_info(h, version=None):
        assert h == "handle0"
        if version is None:
            m.calls.append("mem_v1")
            return types.SimpleNamespace(total=150754820096, used=11910000000, free=138844820096)
        assert version == 0x02000028
        m.calls.append("mem_v2")
        if v2 != "ok":
            raise _NVMLError(v2)
        return types.SimpleNamespace(version=version, total=150754820096, reserved=644939776,
                                     used=11265060224, free=138844820096)

    def util(h):
        if util_error:
            raise _NVMLError(3)
        return types.SimpleNamespace(gpu=42, memory=7)

    m.nvmlInit = init
    m.nvmlShutdown = lambda: m.calls.append("shutdown")
    m.nvmlDeviceGetCount = lambda: count
    m.nvmlDeviceGetHandleByIndex = lambda i: f"handle{i}"
    m.nvmlDeviceGetName = lambda h: "NVIDIA H200"
    m.nvmlDeviceGetMemoryInfo = get_memory_info
    m.nvmlDeviceGetUtilizationRates = util
    return m


def test_nvml_maps_v2_memory_and_utilization(monkeypatch):
    fake = _fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    b = NvmlBackend()
    assert fake.calls == []  # lazy
    assert b.available() and b.why_unavailable() == ""
    s = b.sample()
    assert s.backend == "nvml" and s.device == "NVIDIA H200"
    assert s.vram_total_b == 150754820096 and s.vram_used_b == 11265060224
    assert s.gtt_total_b is None and s.gtt_used_b is None
    assert s.busy_pct == 42
    assert "v2" in s.note and "615.1 MiB" in s.note
    b.sample()
    b.close()
    b.close()
    assert fake.calls == ["init", "mem_v2", "mem_v2", "shutdown"]
    assert b.sample().vram_total_b is None


def test_nvml_falls_back_to_v1_when_driver_lacks_v2(monkeypatch):
    fake = _fake_pynvml(v2=13, util_error=True)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    with NvmlBackend() as b:
        s = b.sample()
        assert s.vram_total_b == 150754820096 and s.vram_used_b == 11910000000
        assert s.busy_pct is None
        assert "does not support NVML memory v2" in s.note and "v1" in s.note
        b.sample()
    # v2 is tried once, then v1 only.
    assert fake.calls == ["init", "mem_v2", "mem_v1", "mem_v1", "shutdown"]


def test_nvml_other_errors_are_not_a_v1_fallback(monkeypatch):
    fake = _fake_pynvml(v2=15)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    with NvmlBackend() as b:
        s = b.sample()
    assert s.vram_total_b is None and s.vram_used_b is None and "NVML error 15" in s.note
    assert "mem_v1" not in fake.calls


def test_nvml_binding_without_v2(monkeypatch):
    fake = _fake_pynvml()
    del fake.nvmlMemory_v2
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    with NvmlBackend() as b:
        s = b.sample()
    assert s.vram_used_b == 11910000000 and "binding has no memory v2" in s.note


@pytest.mark.parametrize("kw, words", [
    (dict(init_error=9), "nvmlInit failed"),
    (dict(count=0), "no NVML device 0 (0 found)"),
])
def test_nvml_unavailable(monkeypatch, kw, words):
    fake = _fake_pynvml(**kw)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    b = NvmlBackend()
    assert not b.available() and words in b.why_unavailable()
    s = b.sample()
    assert s.vram_total_b is None and words in s.note
    b.close()
    assert fake.calls.count("init") == 1
    assert fake.calls.count("shutdown") == (1 if "count" in kw else 0)


def test_nvml_import_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import raises ImportError
    b = NvmlBackend()
    assert not b.available() and "nvidia-ml-py" in b.why_unavailable()


def test_nvml_real_device():
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
    except pynvml.NVMLError as e:
        pytest.skip(f"no NVML here: {e}")
    with NvmlBackend() as b:
        if not b.available():
            pytest.skip(b.why_unavailable())
        s = b.sample()
    assert s.vram_total_b > 0 and 0 <= s.vram_used_b <= s.vram_total_b and s.device


# ---------------------------------------------------------------------------- selection


def test_select_explicit_and_env(sysfs, tmp_path, monkeypatch):
    proc = _proc(tmp_path)
    kw = dict(drm_root=sysfs, proc_root=proc)
    b = select_backend("sysfs", env={}, **kw)
    assert isinstance(b, SysfsBackend) and b.sample().gtt_total_b == 133143986176
    b.close()
    assert isinstance(select_backend(env={"DS4TUI_TELEMETRY": "rss"}, engine_backend="hip", **kw), RssBackend)
    assert isinstance(select_backend(env={"DS4TUI_TELEMETRY": " Fake "}, **kw), FakeBackend)
    assert isinstance(select_backend(env={"DS4TUI_TELEMETRY": "none"}, **kw), NoneBackend)
    # The argument wins over the environment.
    assert isinstance(select_backend("none", env={"DS4TUI_TELEMETRY": "sysfs"}, **kw), NoneBackend)
    # The process environment is not read here: the command line reads DS4TUI_TELEMETRY and passes it.
    monkeypatch.setenv("DS4TUI_TELEMETRY", "fake")
    assert isinstance(select_backend(**kw), RssBackend)


def test_select_errors(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="fake, sysfs, nvml, rss, none"):
        select_backend("rocm", env={})
    with pytest.raises(ValueError, match="'bogus'"):
        select_backend(env={"DS4TUI_TELEMETRY": "bogus"})
    with pytest.raises(TelemetryUnavailable, match="no amdgpu card"):
        select_backend("sysfs", env={}, drm_root=tmp_path / "none")
    with pytest.raises(TelemetryUnavailable, match="statm"):
        select_backend("rss", env={}, proc_root=tmp_path / "none")
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(init_error=9))
    with pytest.raises(TelemetryUnavailable, match="nvml telemetry unavailable: nvmlInit failed"):
        select_backend(env={"DS4TUI_TELEMETRY": "nvml"})
    with pytest.raises(ValueError, match="engine backend"):
        select_backend(env={}, engine_backend="vulkan")


def test_select_by_engine_backend(sysfs, tmp_path, monkeypatch):
    proc = _proc(tmp_path)
    empty = tmp_path / "empty"
    fake = _fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    # CPU engines: process memory, even with a GPU present.
    for eb in ("cpu", "reference"):
        b = select_backend(env={}, engine_backend=eb, drm_root=sysfs, proc_root=proc)
        assert isinstance(b, RssBackend) and b.sample().note == ""
    # HIP: sysfs first ...
    b = select_backend(env={}, engine_backend="hip", drm_root=sysfs, proc_root=proc)
    assert isinstance(b, SysfsBackend)
    b.close()
    assert fake.calls == []
    # ... then NVML ...
    b = select_backend(env={}, engine_backend="hip", drm_root=empty, proc_root=proc)
    assert isinstance(b, NvmlBackend) and b.sample().device == "NVIDIA H200"
    b.close()
    # ... then process memory, saying why.
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(init_error=9))
    b = select_backend(env={}, engine_backend="hip", drm_root=empty, proc_root=proc)
    assert isinstance(b, RssBackend)
    s = b.sample()
    assert s.rss_b == 678 * PAGE
    assert s.note.startswith("no GPU telemetry: no amdgpu card under") and "NVML: nvmlInit failed" in s.note
    # Nothing at all: the none backend with both reasons.
    b = select_backend(env={}, engine_backend="hip", drm_root=empty, proc_root=empty)
    assert isinstance(b, NoneBackend)
    assert "no GPU telemetry" in b.sample().note and "no process telemetry" in b.sample().note


# ------------------------------------------------------------------------------ history


def test_history_ring_and_series():
    h = MemoryHistory(maxlen=3)
    assert h.snapshot() == [] and h.latest() is None and len(h) == 0
    for i in range(5):
        h.append(MemorySample(t_mono_s=float(i), backend="fake", device="d",
                              gtt_used_b=None if i == 3 else i * 10))
    assert len(h) == 3
    assert [s.t_mono_s for s in h.snapshot()] == [2.0, 3.0, 4.0]
    assert h.series("gtt_used_b") == [20, None, 40]
    assert h.series("vram_total_b") == [None, None, None]
    assert h.latest().t_mono_s == 4.0
    with pytest.raises(ValueError):
        h.series("nope")
    with pytest.raises(ValueError):
        MemoryHistory(0)
    snap = h.snapshot()
    h.clear()
    assert len(h) == 0 and len(snap) == 3


def test_history_concurrent_appends():
    h = MemoryHistory(maxlen=50)
    s = MemorySample(t_mono_s=0.0, backend="fake", device="d")

    def writer():
        for _ in range(2000):
            h.append(s)

    threads = [threading.Thread(target=writer) for _ in range(4)]
    for t in threads:
        t.start()
    for _ in range(200):
        assert len(h.snapshot()) <= 50
    for t in threads:
        t.join()
    assert len(h) == 50


# ------------------------------------------------------------------------------- format


@pytest.mark.parametrize("n, text", [
    (None, "—"),
    (0, "0 B"),
    (1023, "1023 B"),
    (1024, "1.0 KiB"),
    (1536, "1.5 KiB"),
    (512 << 20, "512.0 MiB"),
    (644939776, "615.1 MiB"),
    ((1 << 30) - 1, "1.00 GiB"),
    (1320702443, "1.23 GiB"),
    (133143986176, "124.00 GiB"),
    (150754820096, "140.40 GiB"),
    (3 << 40, "3.00 TiB"),
    (-(2 << 20), "-2.0 MiB"),
])
def test_format_bytes(n, text):
    assert format_bytes(n) == text
