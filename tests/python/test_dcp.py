"""DcpDecoder: a one-rank group (MPI COMM_SELF) equals mladcp.decode; under mpirun, the example's step over
2 and 3 CPU ranks equals one rank's decode of the whole cache, and a bad input on one rank raises on every
rank. Skipped without mpi4py, mpirun or an MPI build."""
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from conftest import make_case, reference

import mladcp

MPI = pytest.importorskip("mpi4py.MPI", reason="mpi4py is not installed")
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
if not mladcp._mladcp._mpi_available():
    pytest.skip("this build of mladcp has no MPI communicator", allow_module_level=True)


def test_single_rank_group_equals_decode(rng):
    case = make_case(rng, batch=3, heads=4, lens=(30, 7, 0), q_len=2)
    dec = mladcp.DcpDecoder(mpi_comm=MPI.COMM_SELF)
    assert (dec.world, dec.rank, dec.communicator, dec.backend) == (1, 0, "mpi", "cpu")
    out, lse = dec.decode(case.q, case.kv, case.block_table, case.seq_lens, softmax_scale=case.scale, q_len=2,
                          lse=True, out_dtype="fp32")
    ro, rl = reference(case)
    np.testing.assert_allclose(out, ro, atol=2e-3)
    np.testing.assert_allclose(lse, rl, atol=1e-4)
    bad = np.full_like(out, 4.0)
    with pytest.raises(ValueError, match="q_dtype"):
        dec.decode(mladcp.from_bf16_bits(case.q), case.kv, case.block_table, case.seq_lens,
                   softmax_scale=case.scale, q_len=2, out=bad)
    assert (bad == 4.0).all()


def test_argument_errors():
    with pytest.raises(ValueError, match="mpi_comm"):
        mladcp.DcpDecoder(mpi_comm="world")
    with pytest.raises(ValueError, match="merge"):
        mladcp.DcpDecoder(mpi_comm=MPI.COMM_SELF, merge="ring")
    with pytest.raises(ValueError, match="either"):
        mladcp.DcpDecoder(object(), mpi_comm=MPI.COMM_SELF)


def _mpirun(np_, script, *args):
    mpirun = shutil.which("mpirun")
    if not mpirun:
        pytest.skip("mpirun not found")
    env = dict(os.environ, OMPI_MCA_btl_vader_single_copy_mechanism="none", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1")
    cmd = [mpirun, "-np", str(np_), sys.executable, script, *args]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    print(p.stdout, p.stderr)
    return p


@pytest.mark.parametrize("np_,extra", [(2, []), (3, ["--heads", "12", "--interleave", "2", "--merge", "ag-rs",
                                                      "--q-len", "2"])])
def test_example_under_mpirun(np_, extra):
    p = _mpirun(np_, os.path.join(ROOT, "examples", "python", "dcp_decode.py"), *extra)
    assert p.returncode == 0
    assert p.stdout.count("PASS") == np_


def test_bad_input_on_one_rank_raises_everywhere():
    p = _mpirun(2, os.path.join(HERE, "mpi", "dcp_bad_rank.py"))
    assert p.returncode == 0
    assert p.stdout.count(": OK") == 2
