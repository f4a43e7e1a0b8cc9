"""The packaging trap (docs/design.md §1): `amqp` is py-amqp's import name, which kombu and celery
use; our codec folder `amqp/` must only ever be importable as `maxq_raft.amqp`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_kombu_imports_py_amqp_and_ours_is_maxq_raft_amqp():
    import kombu.transport.pyamqp

    import amqp
    import maxq_raft.amqp
    from maxq_raft.amqp import spec

    # py-amqp: an installed distribution, with the API kombu uses.
    assert Path(amqp.__file__).resolve().parent.parent.name == "site-packages", amqp.__file__
    assert hasattr(amqp, "Connection") and hasattr(amqp, "__version__")
    assert kombu.transport.pyamqp.amqp is amqp
    # Ours: the repo's amqp/ folder, reachable only under maxq_raft.
    assert Path(maxq_raft.amqp.__file__).resolve().parent == REPO / "amqp"
    assert spec.ConnectionStart.INDEX == 0x000A000A
    assert amqp is not maxq_raft.amqp


def test_fresh_interpreter_outside_the_repo(tmp_path):
    # What a user (or celery worker) gets: kombu first, then our package, in one process.
    code = (
        "import kombu, amqp, maxq_raft.amqp, maxq_raft.server.main, maxq_raft.cli.maxqctl\n"
        "from kombu.transport import pyamqp\n"
        "assert hasattr(amqp, 'Connection'), amqp.__file__\n"
        "assert 'site-packages' in amqp.__file__, amqp.__file__\n"
        "assert maxq_raft.amqp.__name__ == 'maxq_raft.amqp'\n"
        "import sys; assert 'storage' not in sys.modules\n"
        "print(amqp.__file__)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=str(tmp_path), capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "site-packages" in result.stdout


def test_repo_root_is_not_on_sys_path():
    # --import-mode=importlib keeps it off; were it on, `import amqp` would find our folder.
    assert str(REPO) not in [str(Path(p).resolve()) for p in sys.path if p]


def test_console_scripts_are_installed():
    bin_dir = Path(sys.executable).parent
    for script in ("maxq-server", "maxqctl"):
        assert (bin_dir / script).exists(), script
    result = subprocess.run([str(bin_dir / "maxqctl"), "--help"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0 and "status" in result.stdout
