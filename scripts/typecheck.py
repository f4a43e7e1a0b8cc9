"""Run mypy on MaxQ-Raft under the module names it installs as: `python scripts/typecheck.py [mypy options]`.

Theory of operation: amqp/ and storage/ install as maxq_raft.amqp and maxq_raft.storage
(`[tool.setuptools] package-dir` in pyproject.toml), and the editable install maps those names
with an import hook, which mypy cannot follow. Given the folders as files, mypy would name them
`amqp.*` and `storage.*`, and `from maxq_raft.amqp.frames import ...` in the server would not
resolve. So this script reads package-dir, lists every .py file under each folder with the module
name it has once installed, and hands mypy that list of (path, module) sources: errors name the
real files in the tree, and `[[tool.mypy.overrides]]` match the installed names. The settings
(strictness per package) are in `[tool.mypy]` of pyproject.toml. Exit status as mypy's: 0 clean,
1 type errors, 2 a blocking error.
"""

from __future__ import annotations

import sys
import time
import tomllib
from pathlib import Path

from mypy.fscache import FileSystemCache
from mypy.main import process_options, run_build
from mypy.modulefinder import BuildSource

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = ROOT / "pyproject.toml"


def installed_modules() -> dict[str, str]:
    """Map each source file (relative to the repo root) to the module name it installs as."""
    with PYPROJECT.open("rb") as f:
        package_dir: dict[str, str] = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    modules: dict[str, str] = {}
    for package, folder in package_dir.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[str(path.relative_to(ROOT))] = ".".join([package, *parts])
    return modules


def main(mypy_args: list[str]) -> int:
    started_s = time.monotonic()
    modules = installed_modules()
    fscache = FileSystemCache()
    # relative paths so that error lines read `amqp/frames.py:12: error: ...`, as plain mypy's do
    sources, options = process_options(["--config-file", str(PYPROJECT), *mypy_args, *modules], fscache=fscache)
    renamed = [BuildSource(s.path, modules[s.path] if s.path else s.module, s.text, str(ROOT)) for s in sources]
    _, messages, blockers = run_build(renamed, options, fscache, started_s, sys.stdout, sys.stderr)
    errors = [m for m in messages if ": error:" in m]
    if blockers:
        return 2
    files = len({m.split(":", 1)[0] for m in errors})
    if errors:
        print(f"Found {len(errors)} errors in {files} files (checked {len(renamed)} source files)")
        return 1
    print(f"Success: no issues found in {len(renamed)} source files")
    return 0


if __name__ == "__main__":
    import os

    os.chdir(ROOT)
    sys.exit(main(sys.argv[1:]))
