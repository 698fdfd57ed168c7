"""The module's NCCL: a private copy loaded on first use (no libnccl.so.2 dependency, no NCCL symbol shared
with the process), what it reports, and the rule that decides whether a torch group's communicator may be
adopted. Runs without a GPU; skipped where the module was built without NCCL."""
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import mladcp
from mladcp.dcp import _choose_adoption

if not mladcp._mladcp._nccl_available():
    pytest.skip("this build of mladcp has no NCCL communicator", allow_module_level=True)


def run_python(code, **env):
    """Runs `code` in a fresh interpreter (nothing loaded yet) without torch; returns its stdout."""
    full_env = dict(os.environ, MLADCP_NO_TORCH="1", **env)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full_env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_adoption_rule():
    """torch's communicator is adopted only when asked, when torch's NCCL is the module's very library
    instance, and when torch exposes the communicator; every other case creates the module's own."""
    assert _choose_adoption(True, True, 0x1234) == (True, _choose_adoption(True, True, 0x1234)[1])
    for requested, shared, ptr in [(False, True, 0x1234), (True, False, 0x1234), (True, True, 0), (False, False, 0),
                                   (True, False, 0)]:
        adopted, reason = _choose_adoption(requested, shared, ptr)
        assert not adopted and reason.startswith("own communicator"), (requested, shared, ptr, reason)
    assert "not requested" in _choose_adoption(False, True, 0x1234)[1]
    assert "another library" in _choose_adoption(True, False, 0x1234)[1]
    assert "_comm_ptr" in _choose_adoption(True, True, 0)[1]


@pytest.mark.skipif(shutil.which("readelf") is None, reason="readelf is not installed")
def test_extension_neither_needs_nor_exports_nccl():
    so = mladcp._mladcp.__file__
    dynamic = subprocess.run(["readelf", "-dW", so], capture_output=True, text=True, check=True).stdout
    assert "libnccl" not in dynamic, dynamic
    symbols = subprocess.run(["readelf", "--dyn-syms", "-W", so], capture_output=True, text=True, check=True).stdout
    nccl = [line for line in symbols.splitlines() if line.split() and line.split()[-1].startswith(("nccl", "pnccl"))]
    assert not nccl, nccl


def test_nccl_is_loaded_privately_on_first_use():
    out = run_python("""
        import mladcp

        def mapped():
            return sorted({l.split()[-1] for l in open("/proc/self/maps") if "libnccl" in l})

        before = mapped()
        info = mladcp.nccl_library()
        print(before, info["loaded"], info["private_copy"], info["version"], info["path"] in mapped(), info["error"])
        print(mladcp._mladcp._nccl_library_shared_with(info["path"]),
              mladcp._mladcp._nccl_library_shared_with("/nonexistent/libtorch_cuda.so"),
              mladcp._mladcp._nccl_library_shared_with(mladcp._mladcp.__file__))
    """)
    first, second = out.splitlines()
    assert first.startswith("[] True True ") and first.split()[4] == "True", out  # nothing before, then loaded
    assert int(first.split()[3]) >= 21400, out
    # The library itself reaches our NCCL; a missing file or a library without NCCL symbols does not.
    assert second.split() == ["True", "False", "False"], out


def test_unloadable_nccl_is_reported():
    out = run_python("""
        import mladcp
        info = mladcp.nccl_library()
        print(info["loaded"], "|", info["error"])
    """, MLADCP_NCCL_LIBRARY="/nonexistent/libnccl.so.2")
    assert out.startswith("False | ") and "/nonexistent/libnccl.so.2" in out and "MLADCP_NCCL_LIBRARY" in out, out
