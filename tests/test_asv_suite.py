"""The asv suite's profile: small shapes unless ``POSENC_ASV_LARGE`` asks for the model-sized ones."""

import json
import math
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]

LIST_PARAMS = """
import json
from benchmarks import absolute, bias, rope
print(json.dumps({
    "rope": rope.RopeRotate.params[0],
    "t5": bias.T5Bias.params[0],
    "peakmem": bias.BiasPeakMemory.params[0],
    "shaw": bias.ShawGather.params[0],
    "sinusoidal": absolute.Sinusoidal.params[0],
}))
"""


def suite_params(large: bool):
    env = {k: v for k, v in os.environ.items() if k != "POSENC_ASV_LARGE"}
    if large:
        env["POSENC_ASV_LARGE"] = "1"
    proc = subprocess.run(
        [sys.executable, "-c", LIST_PARAMS], cwd=ROOT / "asv_benchmarks", env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_default_profile_is_small_and_large_shapes_are_opt_in():
    small, large = suite_params(False), suite_params(True)
    assert max(math.prod(int(n) for n in s.split("x")) for s in small["rope"]) <= 8 * 1024 * 128
    assert max(small["t5"] + small["peakmem"] + small["shaw"]) <= 512
    assert "4x32x8192x128" in large["rope"] and 4096 in large["t5"] and 2048 in large["peakmem"]
    for name in small:
        assert set(small[name]) < set(large[name])


def test_asv_config_has_no_placeholder_url():
    config = json.loads((ROOT / "asv_benchmarks" / "asv.conf.json").read_text())
    assert "invalid" not in config.get("project_url", "")
