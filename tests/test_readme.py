"""The README's *Quick tour* runs as written and quietly (issue 30, item 3): its Python block in a
fresh interpreter, then its ``vta-ext`` commands, each with no warning on stderr (torch 2.13 warns
inside ``ExportedProgram.run_decompositions``; :func:`vta_ext.quantize.import_exported_program`
silences that one warning where it calls it)."""
from __future__ import annotations

import re
import shlex
import subprocess
import sys

from conftest import REPO


def quick_tour():
    """``(python source, [vta-ext argument lists])`` of README.md's "Quick tour" section."""
    text = (REPO / "README.md").read_text()
    section = re.search(r"^## Quick tour\n(.*?)^## ", text, re.S | re.M)
    assert section, "README.md has no '## Quick tour' section"
    python = re.findall(r"^```python\n(.*?)^```", section.group(1), re.S | re.M)
    shell = re.findall(r"^```bash\n(.*?)^```", section.group(1), re.S | re.M)
    assert len(python) == 1 and len(shell) == 1, "the Quick tour has one python and one bash block"
    commands = []
    for line in shell[0].splitlines():
        words = shlex.split(line, comments=True)
        if words:
            assert words[0].endswith("vta-ext"), f"a Quick tour command that is not vta-ext: {line}"
            commands.append(words[1:])
    return python[0], commands


def test_the_quick_tour_runs_without_a_warning(tmp_path):
    source, commands = quick_tour()
    assert "quantize_torch" in source and [c[0] for c in commands] == ["compile", "run", "report"]
    proc = subprocess.run([sys.executable, "-c", source], cwd=tmp_path, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Warning" not in proc.stderr, proc.stderr[-3000:]
    assert "ext_vta build" in proc.stdout      # the build report it prints
    assert (tmp_path / "model.pt2").is_file() and (tmp_path / "x.npy").is_file()
    for args in commands:
        proc = subprocess.run([sys.executable, "-m", "vta_ext", *args], cwd=tmp_path,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"vta-ext {args}: {proc.stderr[-3000:]}"
        assert "Warning" not in proc.stderr, f"vta-ext {args}: {proc.stderr[-3000:]}"
    assert (tmp_path / "model.so").is_file() and (tmp_path / "y.npy").is_file()
