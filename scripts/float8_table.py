#!/usr/bin/env python3
"""Writes the value of every bit pattern of the two float8 formats, from the
formats' definitions alone (exact rational arithmetic), for
kiln/quantization/quantization_test.cc to check kiln's float8 emulation
against: kiln/quantization/testdata/float8_<format>.txt, one line per
pattern: "<bits 0-255> <value as a Python float repr | nan | inf | -inf>".

  e4m3fn: sign, 4 exponent bits (bias 7), 3 mantissa bits; exponent 15 with
          mantissa 7 is NaN; there are no infinities (OCP 8-bit FP spec, "FN").
  e5m2:   sign, 5 exponent bits (bias 15), 2 mantissa bits; IEEE 754-like:
          exponent 31 is infinity (mantissa 0) or NaN.

Run: python3 scripts/float8_table.py   (needs nothing beyond the standard library)
"""
from fractions import Fraction
import os

FORMATS = {
    "e4m3fn": dict(exp_bits=4, man_bits=3, bias=7, ieee_specials=False),
    "e5m2": dict(exp_bits=5, man_bits=2, bias=15, ieee_specials=True),
}


def value(bits, exp_bits, man_bits, bias, ieee_specials):
    sign = -1 if bits & 0x80 else 1
    exponent = (bits >> man_bits) & ((1 << exp_bits) - 1)
    mantissa = bits & ((1 << man_bits) - 1)
    top = (1 << exp_bits) - 1
    if ieee_specials and exponent == top:
        return "nan" if mantissa else ("inf" if sign > 0 else "-inf")
    if not ieee_specials and exponent == top and mantissa == (1 << man_bits) - 1:
        return "nan"
    if exponent == 0:  # subnormal: 0.mantissa * 2^(1 - bias)
        v = Fraction(mantissa, 1 << man_bits) * Fraction(2) ** (1 - bias)
    else:  # normal: 1.mantissa * 2^(exponent - bias)
        v = (1 + Fraction(mantissa, 1 << man_bits)) * Fraction(2) ** (exponent - bias)
    v *= sign
    f = float(v)
    assert Fraction(f) == v, "every float8 value is exact in a double"
    return "-0.0" if (v == 0 and sign < 0) else repr(f)


def main():
    out_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "kiln", "quantization", "testdata")
    os.makedirs(out_dir, exist_ok=True)
    for name, fmt in FORMATS.items():
        path = os.path.join(out_dir, f"float8_{name}.txt")
        with open(path, "w") as f:
            for bits in range(256):
                f.write(f"{bits} {value(bits, **fmt)}\n")
        print("wrote", os.path.normpath(path))


if __name__ == "__main__":
    main()
