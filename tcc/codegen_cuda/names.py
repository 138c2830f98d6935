"""C identifiers for user names: one to one, never a keyword, builtin or generated name."""

from __future__ import annotations

import re

_RESERVED = frozenset("""auto bool break case char const continue default do double else enum extern float for
goto if inline int long register restrict return short signed sizeof static struct switch typedef union
unsigned void volatile while class namespace template typename new delete this operator private public
protected friend virtual true false nullptr asm dim3 threadIdx blockIdx blockDim gridDim warpSize
min max abs exp log sqrt rsqrt sin cos tanh erf floor ceil pow fmod
and or not xor bitand bitor compl not_eq and_eq or_eq xor_eq catch try throw const_cast static_cast
dynamic_cast reinterpret_cast explicit export mutable typeid using wchar_t char16_t char32_t char8_t
constexpr consteval constinit decltype noexcept static_assert thread_local alignas alignof concept
requires co_await co_return co_yield main NULL INFINITY NAN half half2 nv_bfloat16 size_t ptrdiff_t
uint ushort ulong uchar longlong ulonglong printf malloc free memcpy memset assert""".split()) | frozenset(
    f"{fn}{suffix}" for fn in """exp exp2 exp10 expm1 log log2 log10 log1p sqrt rsqrt cbrt rcbrt sin cos tan
    asin acos atan atan2 sinh cosh tanh asinh acosh atanh erf erfc erfinv erfcinv fabs floor ceil round
    trunc rint lrint llrint lround llround nearbyint pow fmod fmin fmax fdim copysign isnan isinf isfinite
    signbit nan fma ldexp frexp modf remainder remquo hypot rhypot lgamma tgamma sincos sincospi sinpi
    cospi ilogb logb scalbn scalbln nextafter norm3d norm4d rnorm3d rnorm4d j0 j1 jn y0 y1 yn""".split()
    for suffix in ("", "f"))
_VECTOR_TYPE = re.compile(r"^u?(char|short|int|long|longlong|float|double)[1-4]$")


def c_name(name: str) -> str:
    """A user name as a C identifier, one to one. Names that C++, CUDA, the math library or
    tcc's own generated code could claim (keywords, builtins, vector types, the ``tcc_``,
    ``TCC_`` and ``__`` prefixes), and names that already start with ``u_``, get a ``u_``
    prefix: no mangled name equals another name, mangled or not, or a generated one."""
    unsafe = name in _RESERVED or _VECTOR_TYPE.match(name) or name.startswith(("tcc_", "TCC_", "__", "u_"))
    return f"u_{name}" if unsafe else name
