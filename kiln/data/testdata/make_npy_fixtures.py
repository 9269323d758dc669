#!/usr/bin/python3
"""Writes the .npy fixtures read by kiln/data/readers_test.cc.

Run with Debian's python3-numpy from this directory:
    /usr/bin/python3 make_npy_fixtures.py
Each array's values are simple formulas that the test recomputes.
"""
import numpy as np

# float64, 2-D: a[i, j] = i * 10 + j + 0.5
np.save("f8_2x3.npy", np.arange(6, dtype="<f8").reshape(2, 3) // 3 * 10
        + np.arange(6).reshape(2, 3) % 3 + 0.5)
# int32, 1-D: 0, -1, 2, -3, 4
np.save("i4_5.npy", np.array([0, -1, 2, -3, 4], dtype="<i4"))
# uint8, 3-D: a[i, j, k] = i * 12 + j * 4 + k
np.save("u1_2x3x4.npy", np.arange(24, dtype="u1").reshape(2, 3, 4))
# bool: alternating, starting True
np.save("b1_4.npy", np.array([True, False, True, False]))
# int64 scalar (shape ())
np.save("i8_scalar.npy", np.array(-7, dtype="<i8"))
# format version 2.0, float32 (3, 2): a = arange * 0.25
with open("f4_v2_3x2.npy", "wb") as f:
    np.lib.format.write_array(f, (np.arange(6, dtype="<f4") * 0.25).reshape(3, 2), version=(2, 0))
# big-endian float32: must be rejected
np.save("f4_big_endian.npy", np.arange(3, dtype=">f4"))
# Fortran order: must be rejected
np.save("f8_fortran.npy", np.asfortranarray(np.arange(6, dtype="<f8").reshape(2, 3)))
