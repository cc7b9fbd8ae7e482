"""The README's three workflows with the real tools (`mc start` batch mode running a shell script of `mc-submit`
and `mc` commands), at test size; the first stage is held until the pipeline's state was looked at."""
from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = r"""
set -e
pre=$(mc-submit --hold --name preprocess sh -c 'echo prepared')
sims=$(mc-submit --cc 0-199 --dependency afterok:$pre sh -c 'echo sim {cc}')
red=$(mc-submit --name reduce --dependency afterok:$sims sh -c 'echo reduced')
mc jobs --json $red |
    python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]; print("RED", j["state"], j["waiting"])'
mc release $pre
mc-submit --wait --dependency afterany:$red true > /dev/null
mc jobs -a --json $pre $sims $red |
    python3 -c 'import json,sys; print("DONE", [j["result"] for j in json.load(sys.stdin)["jobs"]])'

flaky=$(mc-submit --cc 0-9 --max-retries-per-index 3 --on-exit 2=fail --max-failed-indexes 5 \
        sh -c '[ {cc} != 4 ] || [ $MC_TASK_ATTEMPT -ge 1 ] || exit 1
               [ {cc} != 7 ] || exit 2; echo ok {cc} $MC_TASK_ATTEMPT')
mc-submit --wait --dependency afterany:$flaky true > /dev/null || true
echo "FAILED"; mc jobs $flaky --failed
echo "LOG $(mc logs $flaky --index 4 --attempt 1)"
mc jobs --failed --json $flaky > failed.json

driver=$(mc-submit --cc 0-7 --success-indexes 0 sh -c '[ {cc} = 0 ] || sleep 30')
mc-submit --wait --dependency afterok:$driver true > /dev/null
echo "DRIVER $(mc jobs -a --json $driver |
    python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]
print(j["status"], j["counts"]["succeeded"], j["counts"]["cancelled"])')"

held=$(mc-submit --hold true)
mc update $held urgency=30 name=later
mc release $held
mc-submit --wait --dependency afterok:$held true > /dev/null
echo "HELD $(mc eventlog $held | awk '{print $3}' | tr '\n' ' ')"
if mc hold $held 2> err.txt; then echo "HOLD-OK"; else echo "HOLD-REFUSED $(cat err.txt)"; fi
"""


def test_readme_workflows_from_the_cli(tmp_path) -> None:
    script = tmp_path / "workflows.sh"
    script.write_text(SCRIPT)
    proc = subprocess.run([sys.executable, "-m", "minicluster", "start", "--size", "3", "--state-dir",
                           str(tmp_path / "state"), "--", "sh", str(script)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    out = proc.stdout
    assert proc.returncode == 0, (out, proc.stderr)
    assert "RED DEPEND ['afterok:" in out
    assert "DONE ['COMPLETED', 'COMPLETED', 'COMPLETED']" in out
    failed = out.split("FAILED\n")[1].splitlines()
    assert failed[0] == "7"
    assert failed[1] == "  index 4: 0: exit 1 (retried), 1: exit 0 (final)"
    assert failed[2] == "  index 7: 0: exit 2 (final)"
    assert "LOG ok 4 1" in out
    history = json.loads((tmp_path / "failed.json").read_text())["jobs"][0]
    assert history["failed"] == "7" and [a["outcome"] for a in history["attempts"]["4"]] == ["retry", "final"]
    assert "DRIVER 0 1 7" in out
    assert "HELD submit hold update release depend priority alloc start finish release clean" in out
    assert "HOLD-REFUSED mc hold: error: job" in out and "already ended" in out
