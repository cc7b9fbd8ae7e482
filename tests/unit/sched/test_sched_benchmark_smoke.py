"""The matcher benchmark still runs (--quick) and reports every metric."""
import json
import pathlib
import subprocess
import sys

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[3] / "benchmarks" / "matcher.py"


@pytest.mark.slow  # several seconds: the slow tier
def test_benchmark_quick_json():
    out = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--json"], check=True,
                         capture_output=True, text=True, timeout=90).stdout
    doc = json.loads(out)
    assert doc["quick"] is True and doc["results"]
    for size in doc["results"].values():
        assert size["build"]["seconds"] > 0 and size["build"]["rss_mb"] > 0
        assert size["fill"]["ops"] > 0 and size["fill"]["cpu_rate_median"] > 0
        assert size["gang"]["match_ms_median"] > 0
        cycle = size["cycle"]
        assert cycle["first_starts"] > 0 and cycle["running"] > 0
        assert cycle["first_starts"] + cycle["steady_starts"] == cycle["running"] + \
            cycle["first_starts"] // 10
    array = doc["array"]
    assert array["count"] > 0 and array["cycles"] > 0
    assert array["cpu_us_per_element_median"] > 0 and array["task_slots_us"] > 0
    topo = doc["topology"]["topology"]
    assert topo["build"]["racks"] == 32 and topo["half_busy"]["zone_locality_64_exclusive"]["found"]
    assert topo["half_busy"]["rack_locality_32_exclusive"]["racks"] == 1
    assert not topo["fragmented"]["rack_locality_32_exclusive"]["found"]  # no rack is wholly idle
    assert "rack rack-000 has 32" in topo["locality_rack_64_refused"]["reason"]
    sockets = doc["topology"]["sockets"]
    assert sockets["matches"] == sockets["expected_matches"] and sockets["full_at_end"]
    for pair in doc["mixed"].values():
        assert pair["mixed"]["cycle"]["first_starts"] > 0 and pair["mixed"]["trees"] == 0.1
