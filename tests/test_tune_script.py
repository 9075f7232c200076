"""The README's tuning snippet, saved as a plain script without an ``if __name__ == "__main__":``
guard, runs as written: the measurement workers of ``tune.LocalRunner`` do not import the user's
main module (issue 20, part 4).

With ``multiprocessing``'s ``spawn`` (or ``forkserver``) every worker re-imported the script: a
``RuntimeError`` ("... before the current process has finished its bootstrapping phase") per
worker and 129 s instead of 4.5 s for 32 trials. The reference is the same snippet with the guard.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time

import pytest
from conftest import REPO

TRIALS = 32


def readme_tuning_snippet(trials: int = TRIALS) -> str:
    """The README's Python block that tunes with ``LocalRunner``, with ``trials`` trials."""
    text = (REPO / "README.md").read_text()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", text, re.S)
              if "tune.extract_tasks" in b and "LocalRunner" in b]
    assert len(blocks) == 1, ("README.md should have one ```python block that tunes with "
                              f"tune.extract_tasks and tune.LocalRunner; found {len(blocks)}")
    snippet = blocks[0]
    found = re.search(r"n_trial=(\d+)", snippet)
    assert found, "the README tuning snippet has no n_trial=N"
    return re.sub(rf"\b{found.group(1)}\b", str(trials), snippet)


PREAMBLE = f"""\
import sys
sys.path.insert(0, {str(REPO / "tests")!r})
import tvm, vta_ext
from conftest import conv_module
mod = conv_module(1, 16, 16, 8, 3)   # the user's model: one int8 conv block
"""


def run_script(path, cwd, env) -> tuple:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, str(path)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)
    return proc, time.perf_counter() - start


@pytest.mark.slow  # 2 x 32 trials in fresh interpreters: the default run's largest item
def test_readme_tuning_snippet_runs_as_a_plain_script(tmp_path):
    body = PREAMBLE + readme_tuning_snippet()
    scripts = {"plain": body,
               "guarded": 'if __name__ == "__main__":\n' + textwrap.indent(body, "    ")}
    seconds = {}
    for name, text in scripts.items():
        work = tmp_path / name
        work.mkdir()
        (work / "tune_net.py").write_text(text)
        # each run solves its embeddings afresh (same work), in its own cache
        env = dict(os.environ, TVM_CSP_EMBED_CACHE=str(work / "cache"), OPENBLAS_NUM_THREADS="1")
        proc, seconds[name] = run_script(work / "tune_net.py", work, env)
        output = proc.stdout + proc.stderr
        assert proc.returncode == 0, f"{name} script failed:\n{output[-3000:]}"
        assert "RuntimeError" not in output and "bootstrapping" not in output, output[-3000:]
        records = [json.loads(line) for line in (work / "net.json").read_text().splitlines()
                   if line.strip()]
        measured = [r for r in records if not r["verified"]]
        assert measured and all(r["error"] is None for r in measured)
        assert sum(r["verified"] for r in records) == 1  # the best point, verified bit for bit
    print(f"\nREADME tuning snippet, {TRIALS} trials: without __main__ guard "
          f"{seconds['plain']:.1f} s, with guard {seconds['guarded']:.1f} s")
    assert seconds["plain"] < 3 * seconds["guarded"], seconds


def test_local_runner_workers_do_not_run_the_users_script(tmp_path):
    """The fast guard of the same bug: a plain script (no ``__main__`` guard) that records each
    time it runs, then maps ``os.getpid`` over two ``LocalRunner`` workers. The script must run
    once: a worker started by ``multiprocessing``'s ``spawn`` would run it again (one more line
    per worker) before failing in its bootstrapping phase."""
    marker = tmp_path / "runs.txt"
    script = tmp_path / "plain.py"
    script.write_text(textwrap.dedent(f"""\
        import os
        with open({str(marker)!r}, "a") as f:
            f.write(f"{{os.getpid()}}\\n")
        from tvm_csp_embed.tune import LocalRunner
        runner = LocalRunner(n_parallel=2)
        pids = [pid for _, pid in runner.map(os.getpid, [(), ()], lambda i, why: None)]
        runner.close()
        print("worker pids", *pids)
        """))
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    proc, _ = run_script(script, tmp_path, env)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    runs = marker.read_text().split()
    workers = re.search(r"worker pids (\d+) (\d+)", proc.stdout)
    assert workers, output[-3000:]
    assert len(runs) == 1, (runs, output[-3000:])           # the script ran once, in its own process
    assert runs[0] not in workers.groups()                  # the jobs ran in other processes
