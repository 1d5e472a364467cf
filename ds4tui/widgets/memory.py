"""Memory pane: what the GPU driver (or the OS) reports next to what the engine says it holds.

On Strix Halo the model lives in GTT and VRAM is the BIOS carve-out (platform.md §3.1), so both
pools are shown and never added.  On the CPU backend the process RSS is shown.  The engine's own
accounting (weights, KV window ring, compressed KV and compressor state, scratch, device, the amx option's copies) comes from ``ds4_memory``.
"""

from __future__ import annotations

from typing import Sequence

from textual.content import Content

from ds4tui.engine.telemetry import MemorySample, format_bytes
from ds4tui.widgets.series import bar, rows, spark
from ds4tui.widgets.pane import Pane
from ds4tui.widgets.speculation import SPARK_WIDTH


def _pool(name: str, used: int | None, total: int | None, extra: str = "") -> Content:
    if used is None and total is None:
        return Content.styled(f"{name} not reported", "$text-muted")
    frac = (used / total) if used is not None and total else None
    style = "$error" if frac is not None and frac > 0.95 else "$warning" if frac is not None and frac > 0.85 else "$success"
    return Content.assemble(f"{name:<5}", (f"{format_bytes(used)} / {format_bytes(total)}", "bold"),
                            f" {'' if frac is None else f'{100 * frac:.0f}% '}",
                            (bar(frac or 0.0, 1.0, 10), style), extra)


#: Samples in the memory pane's sparkline: with its scale (" 0–123.4 MiB") one row of the narrowest pane.
MEMORY_SPARK_WIDTH = SPARK_WIDTH - 10


class MemoryPane(Pane):
    """``show(sample, history, engine_memory, caches)``: the telemetry sample (``MemorySample``),
    the recent values of the main pool for the sparkline (bars from 0 to the largest value shown, named
    after the line), the engine's ``Memory`` and the optional
    caches that are on (none today: the engine has no optional cache)."""

    def show(self, s: MemorySample | None, series: Sequence[int | None], engine_mem, caches: Sequence[str] = ()) -> None:
        out: list[Content] = []
        if s is None:
            out.append(Content.styled("no sample yet", "$text-muted"))
        else:
            out.append(Content.styled(f"{s.backend}: {s.device}", "$text-muted"))
            if s.backend == "sysfs" or s.gtt_total_b is not None:
                out.append(_pool("GTT", s.gtt_used_b, s.gtt_total_b))
                out.append(_pool("VRAM", s.vram_used_b, s.vram_total_b, " (carve-out)"))
            elif s.backend == "nvml" or s.vram_total_b is not None:
                out.append(_pool("VRAM", s.vram_used_b, s.vram_total_b))
            if s.rss_b is not None:
                out.append(_pool("RSS", s.rss_b, s.host_total_b, " of host"))
            if s.busy_pct is not None:
                out.append(Content(f"GPU busy {s.busy_pct}%"))
            finite = [v for v in series[-MEMORY_SPARK_WIDTH:] if v is not None]
            if finite:  # bars from 0 to the largest value shown, which the line names: a full bar is that
                # value, not a full pool (beside "RSS … 2%" an unlabelled full bar read as a full pool)
                top = max(finite)
                line, _ = spark(series, MEMORY_SPARK_WIDTH, lo=0.0, hi=float(top))
                out.append(Content.assemble((line, "$success"), (f" 0–{format_bytes(top)}", "$text-muted")))
            if s.note and s.backend in ("none", "rss") and "no GPU" in s.note:
                out.append(Content.styled(s.note, "$text-muted"))
        if engine_mem is not None:
            m = engine_mem
            out.append(Content.assemble(("engine holds ", "$text-muted"), (format_bytes(m.total), "bold")))
            out.append(Content(f" weights {format_bytes(m.weights)} · KV ring {format_bytes(m.kv)}"))  # the KV window ring
            out.append(Content(f" compressed KV {format_bytes(m.compressor)} · scratch {format_bytes(m.scratch)}"))
            if m.device:
                out.append(Content(f" device {format_bytes(m.device)}"))
            if getattr(m, "amx_copies", 0):  # the amx option's repacked Q8_0 copies (spec ds4.md §2.9.6)
                out.append(Content(f" amx copies {format_bytes(m.amx_copies)}"))
        out.append(Content.styled("optional caches: " + (", ".join(caches) if caches else "none"), "$text-muted"))
        self.put(rows(out))
