"""One inventory of tensors (engine/layout.py) and one config (DS4Config → ds4_model_config).

The engine's binding table ``ds4tui/native/tensors.h`` is generated from layout.py by
build_native.py; these tests hold the pieces to it.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from ds4tui.engine import layout as L

ROOT = Path(__file__).resolve().parents[1]
NATIVE = ROOT / "ds4tui" / "native"
sys.path.insert(0, str(ROOT))
import build_native  # noqa: E402

sys.path.remove(str(ROOT))


def _config(**kw) -> L.DS4Config:
    from ds4tui.devtools.make_test_model import tiny_config

    return tiny_config(**kw)


def test_every_tensor_names_its_native_member():
    c = _config()
    specs = L.model_tensor_specs(c) + L.support_tensor_specs(c, 3, 3, 16)
    internal = (NATIVE / "internal.h").read_text()
    for t in specs:
        assert t.c_bind in ("mat", "vec", "idx"), f"{t.name}: c_bind {t.c_bind!r}"
        assert re.search(rf"\b{t.c_field}\b", internal), f"{t.name}: member {t.c_field} is not in internal.h"


def test_the_generated_table_is_the_layout():
    text = build_native.tensor_table_text()
    assert (NATIVE / "tensors.h").read_text() == text, "tensors.h is stale: rebuild (python build_native.py)"
    c = _config()
    # every block suffix of every variant is a row, with the member layout.py names
    for layer in range(c.n_layer):
        for t in L.block_tensor_specs(c, layer):
            suffix = t.name[len(f"blk.{layer}."):]
            assert f'{{"{suffix}", DS4_BIND_{t.c_bind.upper()}, offsetof(ds4_layer, {t.c_field})' in text
    for t in L.global_tensor_specs(c):
        assert f'{{"{t.name}", DS4_BIND_{t.c_bind.upper()}, offsetof(struct ds4_engine, {t.c_field})' in text


def test_the_generated_dims_are_layouts_dims():
    """The C expressions of tensors.h evaluated for the tiny config equal layout.py's shapes."""
    c = _config()
    text = build_native.tensor_table_text()
    body = text[text.index("ds4_block_tensor_ne("): text.index("ds4_global_tensor_ne(")]
    cases = dict(re.findall(r"case (\d+): (ne\[0\] = .*?) break;", body))
    names = re.findall(r'\{"([^"]+)", DS4_BIND_\w+, offsetof\(ds4_layer', text)
    env = {f: getattr(c, f) for f in c.__dataclass_fields__}
    for layer in range(c.n_layer):
        kind = {"SWA": 0, "CSA": 1, "HCA": 2}[c.layer_kind(layer).value]
        for t in L.block_tensor_specs(c, layer):
            i = names.index(t.name[len(f"blk.{layer}."):])
            ne = [0, 0, 0]
            code = cases[str(i)].replace("c->", "").replace("/", "//")
            code = re.sub(r"\((\w+ == \d+) \? ([^:]+) : ", r"(\2 if \1 else ", code)
            exec(code.replace("; ", "\n"), {}, dict(env, ne=ne, kind=kind, ratio=c.compress_ratios[layer]))
            want = list(reversed(t.shape)) + [1] * (3 - len(t.shape))
            assert ne == want, f"{t.name}: tensors.h gives ne {ne}, layout.py {want}"


def test_reference_reads_only_inventory_tensors():
    c = _config()
    specs = L.model_tensor_specs(c) + L.support_tensor_specs(c, 3, 3, 16)
    known = {t.name for t in specs} | {t.name.split(".", 2)[-1] for t in specs if t.name.startswith(("blk.", "mtp."))}
    src = (ROOT / "ds4tui" / "engine" / "reference.py").read_text()
    used = set(re.findall(r'"([a-z_.0-9]+\.(?:weight|bias))"', src))
    assert used, "no tensor names found in reference.py"
    unknown = sorted(n for n in used if n not in known)
    assert not unknown, f"reference.py reads tensors layout.py does not list: {unknown}"


def test_model_config_fields_come_from_ds4config():
    """Every field of the C ds4_model_config is a DS4Config field, or one of the few derived ones
    that session.py computes (named here)."""
    from ds4tui._native import ffi

    fields = {name for name, _ in ffi.typeof("ds4_model_config").fields}
    derived = {"rope_yarn"}  # from rope_scaling_type
    missing = sorted(f for f in fields - derived if f not in L.DS4Config.__dataclass_fields__)
    assert not missing, f"ds4_model_config fields with no DS4Config field: {missing}"
