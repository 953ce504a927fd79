"""Go's ``math`` functions as Prometheus 2.42 (go1.19, amd64) computes them, to the last bit.

Python's ``math`` calls the C library, whose results differ from Go's in the last bit for many inputs.
Ported here: ``Exp`` and ``Log`` (Go's amd64 assembly; ``Exp`` takes its fused multiply-add path on CPUs
with AVX2 and FMA, as Go does), ``Log2``, ``Log10``, and the pure-Go (Cephes) ``Sin``, ``Cos``, ``Tan``,
``Asin``, ``Acos``, ``Atan``, ``Atan2``, ``Sinh``, ``Cosh``, ``Tanh``, ``Asinh``, ``Acosh``, ``Atanh``,
``Log1p`` and ``Pow``. Go folds constant expressions
such as ``4 / Pi`` exactly before rounding them once; those are written out rounded the same way.

The algorithms and coefficients are Go's (``src/math``, Copyright The Go Authors, BSD-style license; the
trigonometric ones after Stephen L. Moshier's Cephes library, as Go credits), translated to Python so that
the embedded evaluator's answers equal Prometheus's; Go's license terms apply to them.
"""

from __future__ import annotations

import math
import struct
from fractions import Fraction
from pathlib import Path

NAN = math.nan
INF = math.inf
PI = math.pi
_FOUR_OVER_PI = 1.2732395447351628  # Go's constant 4 / Pi, rounded once
_THREE_PI_OVER_4 = 2.356194490192345  # Go's constant 3 * Pi / 4, rounded once
_INV_LN10 = 0.4342944819032518  # 1 / Ln10
_INV_LN2 = 1.4426950408889634  # 1 / Ln2
_PI4A = 7.85398125648498535156e-1
_PI4B = 3.77489470793079817668e-8
_PI4C = 2.69515142907905952645e-15
_REDUCE_THRESHOLD = float(1 << 29)
_SIN = (1.58962301576546568060e-10, -2.50507477628578072866e-8, 2.75573136213857245213e-6,
        -1.98412698295895385996e-4, 8.33333333332211858878e-3, -1.66666666666666307295e-1)
_COS = (-1.13585365213876817300e-11, 2.08757008419747316778e-9, -2.75573141792967388112e-7,
        2.48015872888517045348e-5, -1.38888888888730564116e-3, 4.16666666666665929218e-2)
_TAN_P = (-1.30936939181383777646e4, 1.15351664838587416140e6, -1.79565251976484877988e7)
_TAN_Q = (1.0, 1.36812963470692954678e4, -1.32089234440210967447e6, 2.50083801823357915839e7,
          -5.38695755929454629881e7)


def _bits(x: float) -> int:
    return int(struct.unpack("<Q", struct.pack("<d", x))[0])


def _from_bits(bits: int) -> float:
    return float(struct.unpack("<d", struct.pack("<Q", bits))[0])


def _cpu_has_fma() -> bool:
    """Go's ``useFMA`` for Exp: AVX2 and FMA (read from /proc/cpuinfo; assumed where it cannot be read)."""
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return True
    return "avx2" in flags and "fma" in flags


_USE_FMA = _cpu_has_fma()


def _fma(a: float, b: float, c: float) -> float:
    """a * b + c rounded once (what VFMADD computes)."""
    if not (math.isfinite(a) and math.isfinite(b) and math.isfinite(c)):
        return a * b + c
    return float(Fraction(a) * Fraction(b) + Fraction(c))


def _cvtsd2sl(v: float) -> int:
    """x86 CVTSD2SL: round half to even; NaN and out of range give the smallest int32."""
    if math.isnan(v) or not -2147483648.5 < v < 2147483647.5:
        return -2147483648
    return round(v)


_EXP_C = (2.4801587301587301587e-5, 1.9841269841269841270e-4, 1.3888888888888888889e-3,
          8.3333333333333333333e-3, 4.1666666666666666667e-2, 1.6666666666666666667e-1, 0.5, 1.0)


def exp(x: float) -> float:
    """Go's amd64 Exp."""
    if math.isnan(x) or math.isinf(x):
        return 0.0 if x == -INF else x
    if x > 7.09782712893384e02:
        return INF
    k = _cvtsd2sl(1.4426950408889634073599246810018920 * x)
    kf = float(k)
    ln2u, ln2l = 0.69314718055966295651160180568695068359375, 0.28235290563031577122588448175013436025525412068e-12
    if _USE_FMA:
        r = _fma(-kf, ln2l, _fma(-kf, ln2u, x)) * 0.0625
        p = _EXP_C[0]
        for c in _EXP_C[1:]:
            p = _fma(p, r, c)
        r = r * p
        for _ in range(3):
            r = r * (r + 2.0)
        r = _fma(r, r + 2.0, 1.0)
    else:
        r = ((x - ln2u * kf) - ln2l * kf) * 0.0625
        p = _EXP_C[0]
        for c in _EXP_C[1:]:
            p = p * r + c
        r = r * p
        for _ in range(4):
            r = r * (2.0 + r)
        r = r + 1.0
    biased = k + 0x3FF
    if biased <= 0:
        return 0.0
    if biased >= 0x7FF:
        return INF
    return r * _from_bits(biased << 52)


def log(x: float) -> float:
    """Go's amd64 Log."""
    bits = _bits(x)
    if bits & ~(1 << 63) == 0:
        return -INF
    if bits >> 63:
        return NAN
    if math.isinf(x) or math.isnan(x):
        return x
    f1 = _from_bits((bits & 0x000FFFFFFFFFFFFF) | 0x3FE0000000000000)
    k = float(((bits >> 52) & 0x7FF) - 0x3FE)
    if f1 <= 7.07106781186547524401e-01:
        k -= 1.0
        f1 *= 2.0
    f = f1 - 1.0
    s = f / (2.0 + f)
    s2 = s * s
    s4 = s2 * s2
    t1 = s2 * (6.666666666666735130e-01 + s4 * (2.857142874366239149e-01 + s4 * (
        1.818357216161805012e-01 + s4 * 1.479819860511658591e-01)))
    t2 = s4 * (3.999999999940941908e-01 + s4 * (2.222219843214978396e-01 + s4 * 1.531383769920937332e-01))
    hfsq = 0.5 * f * f
    return k * 6.93147180369123816490e-01 - ((hfsq - (s * (hfsq + (t1 + t2)) + k * 1.90821492927058770002e-10))
                                             - f)


def log10(x: float) -> float:
    """Go's Log10: ``Log(x) * (1/Ln10)``."""
    return log(x) * _INV_LN10


def log2(x: float) -> float:
    """Go's Log2: exact for powers of two, else ``Log(frac)*(1/Ln2) + exp``."""
    if x == 0 or math.isnan(x) or math.isinf(x) or x < 0:
        return log(x)
    frac, exponent = math.frexp(x)
    if frac == 0.5:
        return float(exponent - 1)
    return log(frac) * _INV_LN2 + float(exponent)


def _octant(x: float) -> tuple[int, float]:
    """Cody-Waite reduction of a non-negative x: (octant, remainder)."""
    j = int(x * _FOUR_OVER_PI)
    y = float(j)
    if j & 1:
        j += 1
        y += 1
    return j, ((x - y * _PI4A) - y * _PI4B) - y * _PI4C


def _sin_poly(z: float, zz: float) -> float:
    s = _SIN
    return z + z * zz * ((((((s[0] * zz) + s[1]) * zz + s[2]) * zz + s[3]) * zz + s[4]) * zz + s[5])


def _cos_poly(zz: float) -> float:
    c = _COS
    return 1.0 - 0.5 * zz + zz * zz * ((((((c[0] * zz) + c[1]) * zz + c[2]) * zz + c[3]) * zz + c[4]) * zz + c[5])


def sin(x: float) -> float:
    """Go's Sin."""
    if x == 0 or math.isnan(x):
        return x
    if math.isinf(x) or abs(x) >= _REDUCE_THRESHOLD:
        return math.sin(x) if math.isfinite(x) else NAN  # Payne-Hanek range: not ported
    sign = x < 0
    j, z = _octant(abs(x))
    j &= 7
    if j > 3:
        sign = not sign
        j -= 4
    zz = z * z
    y = _cos_poly(zz) if j in (1, 2) else _sin_poly(z, zz)
    return -y if sign else y


def cos(x: float) -> float:
    """Go's Cos."""
    if math.isnan(x) or math.isinf(x):
        return NAN
    if abs(x) >= _REDUCE_THRESHOLD:
        return math.cos(x)  # Payne-Hanek range: not ported
    j, z = _octant(abs(x))
    j &= 7
    sign = False
    if j > 3:
        j -= 4
        sign = not sign
    if j > 1:
        sign = not sign
    zz = z * z
    y = _sin_poly(z, zz) if j in (1, 2) else _cos_poly(zz)
    return -y if sign else y


def tan(x: float) -> float:
    """Go's Tan."""
    if x == 0 or math.isnan(x):
        return x
    if math.isinf(x):
        return NAN
    if abs(x) >= _REDUCE_THRESHOLD:
        return math.tan(x)  # Payne-Hanek range: not ported
    sign = x < 0
    j, z = _octant(abs(x))
    zz = z * z
    p, q = _TAN_P, _TAN_Q
    if zz > 1e-14:
        y = z + z * (zz * (((p[0] * zz) + p[1]) * zz + p[2]) / ((((zz + q[1]) * zz + q[2]) * zz + q[3]) * zz + q[4]))
    else:
        y = z
    if j & 2 == 2:
        y = -1 / y
    return -y if sign else y


def _xatan(x: float) -> float:
    z = x * x
    z = z * ((((-8.750608600031904122785e-01 * z + -1.615753718733365076637e+01) * z + -7.500855792314704667340e+01)
              * z + -1.228866684490136173410e+02) * z + -6.485021904942025371773e+01) / (
        ((((z + 2.485846490142306297962e+01) * z + 1.650270098316988542046e+02) * z + 4.328810604912902668951e+02)
         * z + 4.853903996359136964868e+02) * z + 1.945506571482613964425e+02)
    return x * z + x


def _satan(x: float) -> float:
    morebits = 6.123233995736765886130e-17
    if x <= 0.66:
        return _xatan(x)
    if x > 2.41421356237309504880:
        return PI / 2 - _xatan(1 / x) + morebits
    return PI / 4 + _xatan((x - 1) / (x + 1)) + 0.5 * morebits


def atan(x: float) -> float:
    """Go's Atan."""
    if x == 0 or math.isnan(x):
        return x
    return _satan(x) if x > 0 else -_satan(-x)


def asin(x: float) -> float:
    """Go's Asin."""
    if x == 0 or math.isnan(x):
        return x
    sign = x < 0
    x = abs(x)
    if x > 1:
        return NAN
    temp = math.sqrt(1 - x * x)
    temp = PI / 2 - _satan(temp / x) if x > 0.7 else _satan(x / temp)
    return -temp if sign else temp


def acos(x: float) -> float:
    """Go's Acos."""
    return PI / 2 - asin(x)


def atan2(y: float, x: float) -> float:
    """Go's Atan2."""
    if math.isnan(y) or math.isnan(x):
        return NAN
    if y == 0:
        if x >= 0 and math.copysign(1.0, x) > 0:
            return math.copysign(0.0, y)
        return math.copysign(PI, y)
    if x == 0:
        return math.copysign(PI / 2, y)
    if math.isinf(x):
        if x > 0:
            return math.copysign(PI / 4, y) if math.isinf(y) else math.copysign(0.0, y)
        return math.copysign(_THREE_PI_OVER_4, y) if math.isinf(y) else math.copysign(PI, y)
    if math.isinf(y):
        return math.copysign(PI / 2, y)
    q = atan(y / x)
    if x < 0:
        return q + PI if q <= 0 else q - PI
    return q


def sinh(x: float) -> float:
    """Go's Sinh."""
    sign = x < 0
    x = abs(x)
    if x > 21:
        temp = exp(x) * 0.5
    elif x > 0.5:
        ex = exp(x)
        temp = (ex - 1 / ex) * 0.5
    else:
        sq = x * x
        temp = (((-0.2630563213397497062819489e+2 * sq + -0.2894211355989563807284660366e+4) * sq
                 + -0.8991272022039509355398013511e+5) * sq + -0.6307673640497716991184787251e+6) * x
        temp = temp / (((sq + -0.173678953558233699533450911e+3) * sq + 0.1521517378790019070696485176e+5) * sq
                       + -0.6307673640497716991212077277e+6)
    return -temp if sign else temp


def cosh(x: float) -> float:
    """Go's Cosh."""
    x = abs(x)
    if x > 21:
        return exp(x) * 0.5
    ex = exp(x)
    return (ex + 1 / ex) * 0.5


def tanh(x: float) -> float:
    """Go's Tanh."""
    z = abs(x)
    if z > 0.5 * 8.8029691931113054295988e+01:
        return -1.0 if x < 0 else 1.0
    if z >= 0.625:
        s = exp(2 * z)
        z = 1 - 2 / (s + 1)
        return -z if x < 0 else z
    if x == 0 or math.isnan(x):
        return x
    s = x * x
    return x + x * s * ((-9.64399179425052238628E-1 * s + -9.92877231001918586564E1) * s
                        + -1.61468768441708447952E3) / (((s + 1.12811678491632931402E2) * s
                                                          + 2.23548839060100448583E3) * s + 4.84406305325125486048E3)


def _sqrt(x: float) -> float:
    return math.sqrt(x) if x >= 0 or math.isnan(x) else NAN


def _go_div(a: float, b: float) -> float:
    if b == 0:
        return NAN if a == 0 or math.isnan(a) else math.copysign(INF, a) * math.copysign(1.0, b)
    return a / b


def _is_odd_int(x: float) -> bool:
    if abs(x) >= 1 << 53:
        return False
    frac, whole = math.modf(x)
    return frac == 0 and int(whole) & 1 == 1


def pow(x: float, y: float) -> float:
    """Go's Pow (go1.19: squaring for the integer part, ``Exp(yf*Log(x))`` for the fraction)."""
    if y == 0 or x == 1:
        return 1.0
    if math.isnan(x) or math.isnan(y):
        return NAN
    if x == 0:
        if y < 0:
            return math.copysign(INF, x) if _is_odd_int(y) else INF
        return x if _is_odd_int(y) else 0.0
    if math.isinf(y):
        if x == -1:
            return 1.0
        return 0.0 if (abs(x) < 1) == (y > 0) else INF
    if math.isinf(x):
        if x < 0:
            return pow(1 / x, -y)
        return 0.0 if y < 0 else INF
    if y == 0.5:
        return _sqrt(x)
    if y == -0.5:
        return _go_div(1.0, _sqrt(x))
    yf, yi = math.modf(abs(y))
    if yf != 0 and x < 0:
        return NAN
    if yi >= 1 << 63:
        if x == -1:
            return 1.0
        return 0.0 if (abs(x) < 1) == (y > 0) else INF
    a1 = 1.0
    ae = 0
    if yf != 0:
        if yf > 0.5:
            yf -= 1
            yi += 1
        a1 = exp(yf * log(x))
    x1, xe = math.frexp(x)
    i = int(yi)
    while i != 0:
        if xe < -(1 << 12) or xe > 1 << 12:
            ae += xe
            break
        if i & 1 == 1:
            a1 *= x1
            ae += xe
        x1 *= x1
        xe <<= 1
        if x1 < 0.5:
            x1 += x1
            xe -= 1
        i >>= 1
    if y < 0:
        a1 = _go_div(1.0, a1)
        ae = -ae
    try:
        return math.ldexp(a1, ae)
    except OverflowError:
        return math.copysign(INF, a1)


_LP = (6.666666666666735130e-01, 3.999999999940941908e-01, 2.857142874366239149e-01, 2.222219843214978396e-01,
       1.818357216161805012e-01, 1.531383769920937332e-01, 1.479819860511658591e-01)
_LN2_HI = 6.93147180369123816490e-01
_LN2_LO = 1.90821492927058770002e-10
_LN2 = 6.93147180559945286227e-01


def log1p(x: float) -> float:
    """Go's Log1p (FreeBSD's algorithm)."""
    if x < -1 or math.isnan(x):
        return NAN
    if x == -1:
        return -INF
    if math.isinf(x):
        return INF
    absx = abs(x)
    f = 0.0
    iu = 0
    k = 1
    if absx < 4.142135623730950488017e-01:
        if absx < 1.0 / (1 << 29):
            if absx < 1.0 / (1 << 54):
                return x
            return x - x * x * 0.5
        if x > -2.928932188134524755992e-01:
            k = 0
            f = x
            iu = 1
    c = 0.0
    if k != 0:
        if absx < float(1 << 53):
            u = 1.0 + x
            iu = _bits(u)
            k = (iu >> 52) - 1023
            c = 1.0 - (u - x) if k > 0 else x - (u - 1.0)
            c /= u
        else:
            u = x
            iu = _bits(u)
            k = (iu >> 52) - 1023
            c = 0.0
        iu &= 0x000FFFFFFFFFFFFF
        if iu < 0x0006A09E667F3BCD:
            u = _from_bits(iu | 0x3FF0000000000000)
        else:
            k += 1
            u = _from_bits(iu | 0x3FE0000000000000)
            iu = (0x0010000000000000 - iu) >> 2
        f = u - 1.0
    hfsq = 0.5 * f * f
    kf = float(k)
    if iu == 0:
        if f == 0:
            if k == 0:
                return 0.0
            c += kf * _LN2_LO
            return kf * _LN2_HI + c
        r = hfsq * (1.0 - 0.66666666666666666 * f)
        if k == 0:
            return f - r
        return kf * _LN2_HI - ((r - (kf * _LN2_LO + c)) - f)
    s = f / (2.0 + f)
    z = s * s
    lp = _LP
    r = z * (lp[0] + z * (lp[1] + z * (lp[2] + z * (lp[3] + z * (lp[4] + z * (lp[5] + z * lp[6]))))))
    if k == 0:
        return f - (hfsq - s * (hfsq + r))
    return kf * _LN2_HI - ((hfsq - (s * (hfsq + r) + (kf * _LN2_LO + c))) - f)


def asinh(x: float) -> float:
    """Go's Asinh."""
    if math.isnan(x) or math.isinf(x):
        return x
    sign = x < 0
    x = abs(x)
    if x > float(1 << 28):
        temp = log(x) + _LN2
    elif x > 2:
        temp = log(2 * x + 1 / (math.sqrt(x * x + 1) + x))
    elif x < 1.0 / (1 << 28):
        temp = x
    else:
        temp = log1p(x + x * x / (1 + math.sqrt(1 + x * x)))
    return -temp if sign else temp


def acosh(x: float) -> float:
    """Go's Acosh."""
    if x < 1 or math.isnan(x):
        return NAN
    if x == 1:
        return 0.0
    if x >= float(1 << 28):
        return log(x) + _LN2
    if x > 2:
        return log(2 * x - 1 / (x + math.sqrt(x * x - 1)))
    t = x - 1
    return log1p(t + math.sqrt(2 * t + t * t))


def atanh(x: float) -> float:
    """Go's Atanh."""
    if x < -1 or x > 1 or math.isnan(x):
        return NAN
    if x == 1:
        return INF
    if x == -1:
        return -INF
    sign = x < 0
    x = abs(x)
    if x < 1.0 / (1 << 28):
        temp = x
    elif x < 0.5:
        temp = x + x
        temp = 0.5 * log1p(temp + temp * x / (1 - x))
    else:
        temp = 0.5 * log1p((x + x) / (1 - x))
    return -temp if sign else temp
