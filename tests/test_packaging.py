"""The wheel and the editable install import the same package the same way."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

_LIST_MODULES = """
import json, pkgutil, sys, warnings
warnings.simplefilter("ignore")
import maf_compaction
names = sorted(m.name for m in pkgutil.walk_packages(maf_compaction.__path__, "maf_compaction."))
for name in names:
    __import__(name)
print(json.dumps({"file": maf_compaction.__file__, "modules": names, "all": sorted(maf_compaction.__all__)}))
"""


def _inspect(*, extra_path: Path | None = None) -> dict[str, object]:
    prelude = "" if extra_path is None else f"import sys; sys.path.insert(0, {str(extra_path)!r})\n"
    code = prelude + _LIST_MODULES
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd="/")
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("wheel")
    # Build from a copy, so no build/ or egg-info is left (or reused) in the work tree.
    source = tmp_path_factory.mktemp("source") / "maf-compaction"
    skipped = shutil.ignore_patterns(".*", "build", "*.egg-info", "__pycache__", "bench-results", "agent-file-memory")
    shutil.copytree(ROOT, source, ignore=skipped)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(target),
            str(source),
        ],
        check=True,
        capture_output=True,
    )
    (built,) = target.glob("maf_compaction-*.whl")
    return built


def test_editable_install_imports_from_src() -> None:
    """The editable install maps ``maf_compaction`` onto ``src/``."""
    found = _inspect()
    assert Path(str(found["file"])) == ROOT / "src" / "__init__.py"


def test_wheel_ships_every_module_of_the_editable_install(wheel: Path, tmp_path: Path) -> None:
    """Unpacked, the wheel imports the same modules and public names as the editable install."""
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(tmp_path)
        names = archive.namelist()
    assert "maf_compaction/py.typed" in names
    assert not any(name.startswith(("src/", "tests/")) for name in names)
    from_wheel = _inspect(extra_path=tmp_path)
    editable = _inspect()
    assert Path(str(from_wheel["file"])) == tmp_path / "maf_compaction" / "__init__.py"
    assert from_wheel["modules"] == editable["modules"]
    assert from_wheel["all"] == editable["all"]
    assert "maf_compaction.core.anchored" in from_wheel["modules"]  # type: ignore[operator]
    assert "maf_compaction.testing.replay" in from_wheel["modules"]  # type: ignore[operator]
