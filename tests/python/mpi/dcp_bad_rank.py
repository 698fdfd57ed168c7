"""Run under mpirun -np 2: rank 1 passes a block id out of range; every rank must raise (rank 0 learns it
from the agreement round) and write nothing. Prints OK per rank; exits 1 otherwise."""
import sys

import numpy as np
from mpi4py import MPI

import mladcp

dec = mladcp.DcpDecoder(mpi_comm=MPI.COMM_WORLD, deadline_s=20)
r = dec.rank
bs, B, H = 8, 2, 4
bt = np.arange(B * 4, dtype=np.int32).reshape(B, 4)
if r == 1:
    bt[0, 0] = 1000
cache = np.zeros((B * 4, bs, 576), np.uint16)
q = np.zeros((B, H // dec.world, 576), np.uint16)
lens = np.array([40, 9], np.int32)
out = np.full((B, H // dec.world, 512), 7.0, np.float32)
try:
    dec.decode(q, cache, bt, lens, softmax_scale=0.1, out=out)
    print(f"rank {r}: no error raised")
    sys.exit(1)
except (ValueError, RuntimeError) as e:
    untouched = bool((out == 7.0).all())
    print(f"rank {r}: {type(e).__name__}: {e} (output untouched: {untouched})")
    print(f"rank {r}: {'OK' if untouched else 'WROTE'}")
    sys.exit(0 if untouched else 1)
