"""The allocator setting made at ``import grassflow`` (`grassflow._malloc`): applied on glibc,
left alone when the user asks or already tunes malloc. In subprocesses: it is process-wide."""

import json
import os
import subprocess
import sys

import pytest

SCRIPT = "import json, grassflow._malloc as m; print(json.dumps(m.STATE))"


def state(**env) -> dict:
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith("MALLOC_") and k not in ("GLIBC_TUNABLES", "GRASSFLOW_MALLOC")}
    out = subprocess.run([sys.executable, "-c", SCRIPT], env={**clean, **env},
                         capture_output=True, text=True, check=True)  # fmt: skip
    return json.loads(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux")
def test_allocator_setting_and_its_switches():
    # catches: the setting never applied (kernel time back), the off switch ignored, or a
    # user's own malloc tuning overridden
    on = state()
    if on["reason"] == "not glibc":
        pytest.skip("not glibc")
    assert on["applied"] and on["mmap_threshold"] >= 32 << 20 and on["trim_threshold"] > 0
    off = state(GRASSFLOW_MALLOC="default")
    assert not off["applied"] and "GRASSFLOW_MALLOC=default" in off["reason"]
    user = state(MALLOC_TRIM_THRESHOLD_="1000000")
    assert not user["applied"] and "MALLOC_TRIM_THRESHOLD_" in user["reason"]
    tunables = state(GLIBC_TUNABLES="glibc.malloc.trim_threshold=1000000")
    assert not tunables["applied"] and "GLIBC_TUNABLES" in tunables["reason"]
