"""Mutation check of the claim tests (tests/method/test_claims.py): removes the
behaviour of each claim from horovod_prio/method, one at a time, runs the claim
tests and prints which fail (every mutation must make at least one fail).
The source is restored after each run.

    .venv/bin/python tools/claim_mutations.py
"""
import os
import subprocess
import sys

os.chdir(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
muts = [
 ("claim1: no boost on slow", "horovod_prio/method/policy.py", "            self._boost = min(self._boost + 1, self._max_boost)", "            pass"),
 ("claim1: t==threshold not slow", "horovod_prio/method/policy.py", "        elif seconds < self.threshold:", "        elif seconds <= self.threshold:"),
 ("claim1: no new min", "horovod_prio/method/policy.py", "        elif self._min is None or seconds < self._min:\n            self._min = seconds", "        elif self._min is None:\n            self._min = seconds"),
 ("claim2: new_min does not count", "horovod_prio/method/policy.py", "            self._min = seconds\n            self._count += 1", "            self._min = seconds"),
 ("claim2: within does not count", "horovod_prio/method/policy.py", "            self._count += 1\n            kind = \"within\"", "            kind = \"within\""),
 ("claim3: no decay", "horovod_prio/method/policy.py", "            self._boost = max(self._boost - 1, 0)", "            pass"),
 ("claim3: count not reset", "horovod_prio/method/policy.py", "            self._count = 0\n            self._record(\"decay\"", "            self._record(\"decay\""),
 ("claim3: decay at equal count", "horovod_prio/method/policy.py", "        if self._count > self._count_threshold:", "        if self._count >= self._count_threshold:"),
 ("claim4: boost on first groups", "horovod_prio/method/policy.py", "        first_adjusted = len(self._base) - self._adjust_groups", "        first_adjusted = 0"),
 ("claim4: step ignored", "horovod_prio/method/policy.py", "        extra = self._boost * self._step", "        extra = self._boost"),
 ("claim5: priorities decreasing", "horovod_prio/method/sequence.py", "    return list(range(n))", "    return list(range(n))[::-1]"),
 ("claim5: task sequence forward", "horovod_prio/method/sequence.py", "    return list(reversed(list(layers)))", "    return list(layers)"),
 ("claim5: scene first remainder last", "horovod_prio/method/sequence.py", "        sizes = [q + r] + [q] * (n - 1)", "        sizes = [q] * (n - 1) + [q + r]"),
]
ok = True
for desc, path, old, new in muts:
    src = open(path).read()
    assert old in src, desc
    open(path, "w").write(src.replace(old, new, 1))
    try:
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/method/test_claims.py"], capture_output=True, text=True)
        failed = [l.split("::")[1].split(" ")[0] for l in r.stdout.splitlines() if l.startswith("FAILED")]
        print("%-40s -> %d failing: %s" % (desc, len(failed), ", ".join(failed)[:200]))
        ok = ok and bool(failed)
    finally:
        open(path, "w").write(src)
sys.exit(0 if ok else 1)
