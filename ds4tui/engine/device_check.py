"""On AMD, the first device pass runs in a child process, before the model loads.

ROCm does not return an error for a GPU memory fault: its runtime prints ``Memory access fault by
GPU node-N (Agent handle: ...) on address ...  Reason: ...`` and aborts the process.  In the chat
app that leaves a dead terminal.  So before a hip engine on an AMD device uploads anything,
:func:`guard` runs a child Python process (``python -m ds4tui.engine.device_check``) that opens a
small synthetic model (:class:`ds4tui.engine.synthetic.SyntheticModel`: random, valid weights in
the model's q2 mix) at the model's own widths, on the same library and device, and runs what a
session's first passes run: a prefill of :data:`PREFILL` tokens in chunks (compressed rows
emitted), one-token decodes and a verify-shaped pass of 6 rows that is then rolled back; the
logits must be finite.  The synthetic model keeps one layer of each kind the model has (sliding,
compressed-sparse, heavily-compressed) and at most :data:`MAX_EXPERTS` experts, so it costs a few
GiB and seconds, not the model's size.

The child's exit status decides: 0, and the engine goes on to upload the model; a signal (ROCm's
abort is SIGABRT) or any other status becomes a :class:`DeviceFaultError` that names what happened
and carries the end of the child's output, raised before anything was uploaded; the app shows it
as the error of opening the model.  A library that passed is not checked again in the process.
The child finds its library already passed, so its own engine does not start another child.
A fault in a later pass (other shapes, a longer context) still ends the process: the guard covers
the first passes, with the kernels and shapes they use.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import asdict, replace

from ds4tui.engine.errors import DeviceFaultError

#: Tokens the child prefills (in chunks of 64): past a heavily-compressed layer's ratio of 128.
PREFILL = 160
#: Experts the synthetic model keeps (the routed layers still choose n_expert_used of them).
MAX_EXPERTS = 16
#: Seconds the child may take (a hung GPU is reported as such).
TIMEOUT_S = 600

_passed: set[str] = set()


def check_config(config):
    """The synthetic model's config: one layer of each kind ``config`` has, in its order, at most
    :data:`MAX_EXPERTS` experts (when the routing has no expert groups), no hash-routed layers."""
    seen, keep = set(), []
    for i in range(config.n_layer):
        kind = config.layer_kind(i)
        if kind not in seen:
            seen.add(kind)
            keep.append(i)
    pick = lambda xs: None if xs is None else tuple(xs[i] for i in keep)  # noqa: E731
    experts = config.n_expert
    if not config.expert_group_count:
        experts = min(config.n_expert, max(MAX_EXPERTS, config.n_expert_used))
    return replace(config, n_layer=len(keep), n_hash_layer=0, n_expert=experts,
                   compress_ratios=pick(config.compress_ratios), swiglu_clamp=pick(config.swiglu_clamp),
                   swiglu_clamp_shexp=pick(config.swiglu_clamp_shexp))


def guard(library: str, config, *, force: bool = False, argv: list[str] | None = None,
          timeout: float = TIMEOUT_S) -> DeviceFaultError | None:
    """Run the child pass for ``library`` and a model of ``config`` (once per library and process):
    None when it passed, else the :class:`DeviceFaultError` to raise.  ``force``: check again even
    if the library passed before; ``argv``: the child command instead of this module's (tests)."""
    library = str(library)
    if library in _passed and not force:
        return None
    cfg = asdict(check_config(config))
    cmd = argv or [sys.executable, "-m", "ds4tui.engine.device_check", "--library", library, "--config",
                   json.dumps(cfg)]
    t0 = time.monotonic()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        out = (exc.stderr or b"")
        out = out.decode(errors="replace") if isinstance(out, bytes) else out
        return DeviceFaultError(f"the GPU did not finish its first device pass in {timeout:.0f} s (a child process "
                                f"running a small model on {library}): the device hangs; nothing was uploaded",
                                returncode=None, output=out[-2000:])
    if r.returncode == 0:
        _passed.add(library)
        return None
    out = (r.stderr or "") + (r.stdout or "")
    lines = [ln for ln in out.strip().splitlines() if ln.strip()]
    fault = next((ln.strip() for ln in lines if "fault" in ln.lower()), "")
    if r.returncode < 0:
        import signal

        try:
            name = signal.Signals(-r.returncode).name
        except ValueError:
            name = f"signal {-r.returncode}"
        how = f"was killed by {name}" + (" (ROCm aborts a process on a GPU memory fault)" if name == "SIGABRT" else "")
    else:
        how = f"failed with exit status {r.returncode}"
    said = (fault or (lines[-1].strip() if lines else "no output")).rstrip(".")
    return DeviceFaultError(f"the GPU failed its first device pass: a child process running a small model with this "
                            f"model's widths on {library} {how} after {time.monotonic() - t0:.1f} s: {said}. Nothing "
                            f"was uploaded; the device or the library's build for it is at fault (README: Strix Halo)",
                            returncode=r.returncode, output="\n".join(lines[-20:]))


def _child(library: str, config: dict) -> int:
    import numpy as np

    from ds4tui.engine import layout as L
    from ds4tui.engine.session import Engine
    from ds4tui.engine.synthetic import SyntheticModel

    _passed.add(library)  # this process is the check: its engine must not start another child
    for k in ("compress_ratios", "swiglu_clamp", "swiglu_clamp_shexp"):
        if config.get(k) is not None:
            config[k] = tuple(config[k])
    cfg = L.DS4Config(**config)
    t0 = time.monotonic()
    model = SyntheticModel(cfg, seed=0)
    eng = Engine(model, backend="hip", gpu_library=library)
    try:
        s = eng.session(PREFILL + 16, n_batch=64)
        rng = np.random.default_rng(0)
        ids = rng.integers(100, min(cfg.n_vocab, 128000), PREFILL + 8).tolist()
        last = s.prefill(ids[:PREFILL])
        rows = [last] + [s.prefill([t]) for t in ids[PREFILL:PREFILL + 2]]
        base = s.n_tokens
        rows.append(s.prefill(ids[PREFILL + 2:PREFILL + 8], logits="all"))
        s.truncate(base)
        if not all(np.isfinite(r).all() for r in rows):
            print("device check: non-finite logits", file=sys.stderr)
            return 3
        s.close()
    finally:
        eng.close()
    print(f"device check: {cfg.n_layer} layers at width {cfg.n_embd}, {cfg.n_expert} experts: prefill {PREFILL}, "
          f"2 decodes, a 6-row verify: ok in {time.monotonic() - t0:.1f} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ds4tui.engine.device_check", description=__doc__.split("\n\n")[0])
    ap.add_argument("--library", required=True)
    ap.add_argument("--config", required=True, help="the synthetic model's DS4Config as JSON")
    a = ap.parse_args(argv)
    return _child(a.library, json.loads(a.config))


if __name__ == "__main__":
    sys.exit(main())
