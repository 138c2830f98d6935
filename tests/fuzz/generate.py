"""Random valid tcc programs for differential fuzzing.

``generate(seed)`` builds one ``.tc`` file (one to three ops) from a seeded ``random.Random``,
with the symbol values and compile-time parameters to call each op at. Everything the language
has is drawn: every dtype (f16 and bf16 included) and cast, every operator and math function,
``select``, ``and/or/not``, reductions (several per statement, nested, over outer axes, with
inferred or explicit extents), intermediates read once, twice or never (declared or inferred),
strided, offset, reversed, modular and constant indices, ``pad`` views, compile-time parameters
in shapes and indices, several results, odd, size-1 and zero-size dimensions; indices that read
data or runtime offsets (in range, or poisoned out of range), ``+=`` scatters with duplicates,
prefix reductions (scans), recurrences, ``rand``/``randn``/``philox`` and dtype parameters
(``fuzz.constructs``). Templates (``fuzz.templates``) add the shapes the compiler specialises for
(GEMMs, convolutions, row chains), and two such contractions chained through an intermediate.

The generator only writes programs whose answer does not hinge on rounding: operations that are
discontinuous in their operands (``floor``, ``ceil``, ``//``, ``%``, comparisons, casts to
integers) are applied only to *exact* values (integers, bools, float inputs read directly), and
float magnitudes are kept bounded (``tanh`` wraps a value that may grow past the dtype's range),
so that any difference larger than the per-dtype bound is a bug and not an artefact of f32
against f64 evaluation.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from fuzz import constructs
from fuzz.constructs import Annotations
from fuzz.templates import template

FLOATS = ("f32", "f64", "f16")
INTS = ("i32", "i64", "i8")
SIZES = (1, 2, 3, 5, 7, 8, 16, 33, 64)
MATH = ("tanh", "sigmoid", "erf", "abs", "sin", "cos", "exp", "log", "sqrt", "rsqrt")
SYMBOLS = ("N", "M", "K")


@dataclass
class Dim:
    """One dimension of a tensor: ``base`` is a symbol or literal, ``scale`` 1 or 2 (strided
    inputs are declared ``2*N``), ``extra`` the padding or parameter added to it."""

    base: str
    scale: int = 1
    extra: int = 0
    extra_text: str = ""

    def text(self) -> str:
        t = self.base if self.scale == 1 else f"2*{self.base}"
        return f"{t} + {self.extra_text}" if self.extra_text else t


@dataclass
class Tensor:
    name: str
    dtype: str
    dims: list[Dim]
    exact: bool  # its values are exact (inputs, integer or bool data)
    mag: float  # rough bound of its magnitude
    spelled: str = ""  # "T": declared with the op's dtype parameter (``dtype`` is its binding)

    def decl(self) -> str:
        return f"{self.spelled or self.dtype}[{', '.join(d.text() for d in self.dims)}]"


@dataclass
class Value:
    text: str
    kind: str  # "int", "bool", "float"
    exact: bool
    mag: float


@dataclass
class OpCase:
    name: str
    bindings: dict[str, int]  # symbols and compile-time parameters to call with


@dataclass
class Program:
    seed: int
    source: str
    cases: list[OpCase] = field(default_factory=list)


class _OpBuilder:
    """Builds one op: inputs, a chain of statements, results."""

    def __init__(self, rnd: random.Random, name: str, sizes: dict[str, int], bf16: bool):
        self.rnd, self.name, self.sizes = rnd, name, sizes
        self.tensors: list[Tensor] = []
        self.inputs: list[str] = []
        self.scalars: list[tuple[str, str]] = []
        self.lines: list[str] = []
        self.params: dict[str, int] = {}
        self.bf16 = bf16
        self.counter = 0
        self.index_targets: dict[str, str] = {}  # index input -> the dim base its values fit
        self.ann = Annotations()
        self.generic: tuple[str, str] | None = None  # the kind and binding of T
        self.seed: str | None = None  # the scalar seeding rand/randn/philox

    # ------------------------------------------------------------------ header
    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def dtype(self) -> str:
        r = self.rnd.random()
        if r < 0.45:
            return "f32"
        if r < 0.55:
            return "f64"
        if r < 0.65:
            return "bf16" if self.bf16 and self.rnd.random() < 0.5 else "f16"
        if r < 0.9:
            return self.rnd.choice(INTS)
        return "bool"

    def add_inputs(self) -> None:
        if self.rnd.random() < 0.3:
            self.params["P"] = self.rnd.choice([0, 1, 2])
        for _ in range(self.rnd.randint(1, 3)):
            rank = self.rnd.choice([1, 1, 2, 2, 2, 3])
            dims = []
            for _ in range(rank):
                r = self.rnd.random()
                sym = self.rnd.choice(SYMBOLS)
                if r < 0.7 or sym not in self.syms + [d.base for d in dims]:
                    dims.append(Dim(sym))
                elif r < 0.8:
                    dims.append(Dim(sym, scale=2))
                elif r < 0.9 and "P" in self.params:
                    dims.append(Dim(sym, extra=self.params["P"], extra_text="P"))
                else:
                    dims.append(Dim(str(self.rnd.choice([1, 3, 4]))))
            dt = self.dtype()
            t = Tensor(self.fresh("X"), dt, dims, exact=True, mag=9.0 if dt in INTS else 4.0)
            self.tensors.append(t)
            self.inputs.append(t.name)
        if self.rnd.random() < 0.25:
            dt = self.rnd.choice(["f32", "f64", "i32", "i64"])
            self.scalars.append((self.fresh("a"), dt))
        if self.rnd.random() < 0.35:
            constructs.add_index_inputs(self)

    @property
    def syms(self) -> list[str]:
        """The symbols the inputs bind: the only ones a body or a result may use."""
        return sorted({d.base for t in self.tensors if t.name in self.inputs for d in t.dims if d.base.isalpha()})

    def extent(self) -> str:
        if self.syms and self.rnd.random() < 0.85:
            return self.rnd.choice(self.syms)
        return str(self.rnd.choice([1, 3, 4]))

    # ------------------------------------------------------------------ statements
    def add_pad(self) -> None:
        src = self.rnd.choice(self.tensors)
        lo = [self.rnd.choice([0, 1, 2]) for _ in src.dims]
        hi = [self.rnd.choice([0, 1]) for _ in src.dims]
        name = self.fresh("Xp")
        value = ""
        if self.rnd.random() < 0.3 and src.dtype != "bool":
            value = ", value=-1" if src.dtype in INTS else ", value=-1.0"
        self.lines.append(f"{name} = pad({src.name}, {list(lo)}, {list(hi)}{value})".replace("'", ""))
        dims = [Dim(d.base, d.scale, d.extra + a + b, _plus(d.extra_text, a + b)) for d, a, b in zip(src.dims, lo, hi)]
        self.tensors.append(Tensor(name, src.dtype, dims, src.exact, max(src.mag, 1.0)))

    def add_statement(self, result: str | None = None) -> Tensor:
        rank = self.rnd.choice([1, 1, 2, 2, 2, 3])
        axes = []
        for v in ("i", "j", "l")[:rank]:
            axes.append((v, self.extent()))
        ctx = _Context(self, dict(axes))
        name = result or self.fresh("T")
        recurrent = self.rnd.random() < 0.12
        if recurrent:  # reads itself: declared
            value = constructs.recurrence(ctx, name, axes)
        else:
            value = ctx.expr(depth=self.rnd.randint(1, 4))
        dtype, spelled = self.store_dtype(value)
        inferable = all(ctx.alone(v, value.text) for v, _ in axes)
        declared = result is None and (recurrent or not inferable or self.rnd.random() < 0.3)
        dims = [Dim(ext) for _, ext in axes]
        t = Tensor(name, dtype or _kind_dtype(value.kind), dims, False, value.mag, spelled)
        if declared:
            self.lines.append(f"{name}: {t.decl()}")
        elif result is None:
            t.dtype, t.spelled = _kind_dtype(value.kind), ""  # inferred by sema: the expression's own dtype
        self.lines.append(f"{name}[{', '.join(v for v, _ in axes)}] = {value.text}")
        t.exact = value.exact and (t.dtype if declared or result else value.kind) in INTS + ("bool", "int")
        if result is None:
            self.tensors.append(t)
        if self.rnd.random() < 0.2:
            constructs.add_scatter(self, t)
        return t

    def store_dtype(self, value: Value) -> tuple[str, str]:
        """The dtype to store ``value`` in (and "T" where it is the dtype parameter's binding)."""
        if self.generic and self.rnd.random() < 0.4 and (value.kind == "float" or not value.exact) \
                == (self.generic[0] == "float"):
            return self.generic[1], "T"
        if value.kind == "float" or not value.exact:
            return self.rnd.choice(["f32", "f32", "f64", "f16"] + (["bf16"] if self.bf16 else [])), ""
        if value.kind == "int":
            return self.rnd.choice(INTS + ("f32", "f64")), ""
        return self.rnd.choice(["bool", "i32", "f32"]), ""


def _plus(text: str, n: int) -> str:
    if n == 0:
        return text
    return f"{text} + {n}" if text else str(n)


def _kind_dtype(kind: str) -> str:
    return {"int": "i64", "bool": "bool", "float": "f32"}[kind]


class _Context:
    """Index variables of one statement (and of the reductions opened inside it)."""

    def __init__(self, op: _OpBuilder, axes: dict[str, str]):
        self.op, self.rnd = op, op.rnd
        self.vars: dict[str, str] = dict(axes)  # index variable -> extent (symbol or literal)
        self.outer = set(axes)  # the statement's own variables (a reduction extent may use them)
        self.nreduce = 0
        self.excluded = ""  # a tensor not to read (the one a scatter adds into)
        self.no_data = False  # indices here read no data (inside an index that does)

    alone = staticmethod(constructs.alone)

    # ------------------------------------------------------------------ expressions
    def expr(self, depth: int) -> Value:
        r = self.rnd.random()
        if depth <= 0 or r < 0.15:
            return self.leaf()
        if r < 0.35:
            return self.binary(depth)
        if r < 0.47:
            return self.math(depth)
        if r < 0.6:
            return self.reduce(depth)
        if r < 0.7:
            return self.select(depth)
        if r < 0.8:
            return self.integer(depth)
        if r < 0.88:
            return self.cast(depth)
        return self.binary(depth)

    def leaf(self) -> Value:
        r = self.rnd.random()
        if r < 0.05:
            return constructs.random_leaf(self)
        if r < 0.75:
            return self.read()
        if r < 0.82:
            v = self.rnd.choice(list(self.vars))
            if self.rnd.random() < 0.5:
                return Value(f"f32({v})", "float", True, 64.0)
            return Value(v, "int", True, 64.0)
        if r < 0.86 and self.op.scalars:
            name, dt = self.rnd.choice(self.op.scalars)
            return Value(name, "float" if dt[0] == "f" else "int", True, 4.0)
        if r < 0.9:
            return Value(self.rnd.choice(self.op.syms), "int", True, 64.0) if self.op.syms else self.leaf()
        if self.rnd.random() < 0.5:
            return Value(str(self.rnd.choice([0, 1, 2, 3, 7])), "int", True, 7.0)
        return Value(self.rnd.choice(["0.5", "1.5", "2.0", "0.25", "1e-3", "3.0"]), "float", True, 3.0)

    def read(self) -> Value:
        for _ in range(8):
            t = self.rnd.choice([t for t in self.op.tensors if t.name != self.excluded])
            idx = [self.index(d) for d in t.dims]
            if None not in idx:
                break
        else:  # only empty tensors that no variable here walks: a literal instead
            return Value("1.5", "float", True, 1.5)
        kind = "bool" if t.dtype == "bool" else ("float" if t.dtype[0] in "fb" else "int")
        return Value(f"{t.name}[{', '.join(idx)}]", kind, t.exact, t.mag)

    def index(self, d: Dim) -> str | None:
        """An index expression in range for dim ``d`` under this statement's variables (one that
        reads data is in range for the data the checker draws, unless it poisons it)."""
        if not self.no_data and self.rnd.random() < 0.15:
            data = constructs.data_index(self, d)
            if data is not None:
                return data
        same = [v for v, ext in self.vars.items() if ext == d.base]
        r = self.rnd.random()
        if same and r < 0.75:
            v = self.rnd.choice(same)
            if d.scale == 2:
                return f"2*{v} + 1" if self.rnd.random() < 0.5 else f"2*{v}"
            if d.extra:  # a padded dim: never the index alone, or range inference would see N + pad
                return f"{v} + {self.rnd.randint(1, d.extra)}"
            if self.rnd.random() < 0.15:
                return f"{d.text()} - 1 - {v}"
            return v
        size = self.op.sizes.get(d.base, None) if not d.base.isdigit() else int(d.base)
        if size is not None and size * d.scale + d.extra >= 1 and r < 0.85:
            if self.rnd.random() < 0.5:
                return "0"
            v = self.rnd.choice(list(self.vars))
            return f"({v} + 1) % ({d.text()})" if self.rnd.random() < 0.5 else f"{v} % ({d.text()})"
        return None  # an empty dim that no variable of this extent walks: no index is in range

    def binary(self, depth: int) -> Value:
        a, b = self.expr(depth - 1), self.expr(depth - 1)
        kinds = {a.kind, b.kind}
        num = lambda v: v if v.kind != "bool" else Value(f"i32({v.text})", "int", True, 1.0)  # noqa: E731
        a, b = num(a), num(b)
        kind = "float" if "float" in kinds else "int"
        exact = a.exact and b.exact and kind == "int"
        op = self.rnd.choice(["+", "-", "*", "/", "max", "min", "**"])
        if op == "/":
            if kind == "int" and self.rnd.random() < 0.5:
                return Value(f"({a.text} / {b.text})", "float", False, a.mag)  # may divide by zero: inf/nan
            return Value(f"({a.text} / (abs({b.text}) + 1.0))", "float", False, a.mag)
        if op in ("max", "min"):
            return self.bound(Value(f"{op}({a.text}, {b.text})", kind, exact, max(a.mag, b.mag)))
        if op == "**":
            return self.bound(Value(f"({a.text}) ** 2", kind, exact, a.mag * a.mag))
        mag = a.mag * b.mag if op == "*" else a.mag + b.mag
        return self.bound(Value(f"({a.text} {op} {b.text})", kind, exact, mag))

    def bound(self, v: Value) -> Value:
        """Wrap a float value that could leave the range where f16/f32 and f64 agree."""
        if v.kind == "float" and v.mag > 200:
            return Value(f"tanh({v.text} * 0.01)", "float", False, 1.0)
        if v.kind == "int" and v.mag > 1e6:  # (100: the literal must fit an i8 operand)
            return Value(f"({v.text} % 100)", "int", v.exact, 100.0)
        return v

    def math(self, depth: int) -> Value:
        a = self.expr(depth - 1)
        if a.kind == "bool":
            a = Value(f"f32({a.text})", "float", True, 1.0)
        fn = self.rnd.choice(MATH + ("floor", "ceil", "neg", "pow"))
        if fn in ("floor", "ceil"):
            if not a.exact:
                fn = "abs"
            else:
                return Value(f"{fn}({a.text})", a.kind, True, a.mag + 1)
        if fn == "neg":
            return Value(f"-{a.text}" if a.text[0] != "-" else f"-({a.text})", a.kind, a.exact, a.mag)
        if fn == "abs":
            return Value(f"abs({a.text})", a.kind, a.exact, a.mag)
        if fn == "exp":  # exp turns its argument's absolute error into relative error: keep it <= 1
            return Value(f"exp(min({a.text}, 1.0))", "float", False, 2.8)
        if fn == "log":
            return Value(f"log(abs({a.text}) + 1.0)", "float", False, 10.0)
        if fn == "sqrt":  # steep at 0: an inexact argument is kept away from it (fuzz seed 3775)
            shift = "" if a.exact else " + 1.0"
            return Value(f"sqrt(abs({a.text}){shift})", "float", False, a.mag ** 0.5 + 1)
        if fn == "rsqrt":
            return Value(f"rsqrt(abs({a.text}) + 1.0)", "float", False, 1.0)
        if fn == "pow":
            return Value(f"pow(abs({a.text}) + 0.5, 1.5)", "float", False, (a.mag + 1) ** 1.5)
        if fn in ("sin", "cos") and a.mag > 50:
            a = Value(f"tanh({a.text})", "float", False, 1.0)
        return Value(f"{fn}({a.text})", "float", False, 1.0 if fn != "abs" else a.mag)

    def select(self, depth: int) -> Value:
        cond = self.condition(depth - 1)
        a, b = self.expr(depth - 1), self.expr(depth - 1)
        if a.kind != b.kind:
            a = a if a.kind == "float" else Value(f"f32({a.text})", "float", a.exact, a.mag)
            b = b if b.kind == "float" else Value(f"f32({b.text})", "float", b.exact, b.mag)
        return Value(f"select({cond}, {a.text}, {b.text})", a.kind, a.exact and b.exact, max(a.mag, b.mag))

    def condition(self, depth: int) -> str:
        parts = []
        for _ in range(self.rnd.choice([1, 1, 2])):
            a = self.exact_value(depth)
            if a.kind == "bool":
                parts.append(a.text if self.rnd.random() < 0.7 else f"not {a.text}")
            else:
                cmp = self.rnd.choice(["<", "<=", ">", ">=", "==", "!="])
                lits = ["0", "1", "0.5", "-0.5"] if a.kind == "float" else ["0", "2", "-3"]
                lit = self.rnd.choice(lits)
                parts.append(f"{a.text} {cmp} {lit}")
        return f" {self.rnd.choice(['and', 'or'])} ".join(f"({p})" for p in parts)

    def exact_value(self, depth: int) -> Value:
        for _ in range(6):
            v = self.read() if self.rnd.random() < 0.7 else self.integer(depth)
            if v.exact:
                return v
        return Value(self.rnd.choice(list(self.vars)), "int", True, 64.0)

    def integer(self, depth: int) -> Value:
        """An exact integer (or exact-float) computation with ``//`` and ``%``."""
        a = self.exact_value(max(depth - 1, 0)) if depth > 0 else self.leaf()
        if not a.exact:
            return a
        if a.kind == "bool":
            return Value(f"i32({a.text})", "int", True, 1.0)
        op = self.rnd.choice(["//", "%"])
        if a.kind == "float":  # x // 0.5 is exact; x % 0.5 is not (-1e-4 % 0.5 rounds to 0.5 in f16)
            return Value(f"({a.text} {op} 0.5)", "float", op == "//", a.mag * 2 + 1)
        d = self.rnd.choice(["3", "-2", "7"]) if self.rnd.random() < 0.7 else self.exact_int_text()
        return Value(f"({a.text} {op} {d})", "int", True, a.mag)

    def exact_int_text(self) -> str:
        ints = [t for t in self.op.tensors if t.dtype in INTS]
        if not ints:
            return "5"
        t = self.rnd.choice(ints)
        idx = [self.index(d) for d in t.dims]
        return "5" if None in idx else f"{t.name}[{', '.join(idx)}]"

    def cast(self, depth: int) -> Value:
        a = self.expr(depth - 1)
        if a.exact and a.kind != "bool" and self.rnd.random() < 0.5 and a.mag < 100:
            dt = self.rnd.choice(INTS if a.mag < 100 else ("i32", "i64"))
            return Value(f"{dt}({a.text})", "int", True, 127.0 if dt == "i8" else a.mag)
        if self.op.generic and self.op.generic[0] == "float" and self.rnd.random() < 0.3:
            return Value(f"T({a.text})", "float", a.exact and self.op.generic[1] == "f64", min(a.mag, 60000.0))
        if self.op.bf16 and self.rnd.random() < 0.1:  # (CUDA) an 8-bit float, saturating, widened at once
            dt = self.rnd.choice(("f8e4m3", "f8e5m2"))
            return Value(f"f32({dt}({a.text}))", "float", False, min(a.mag, 448.0 if dt == "f8e4m3" else 57344.0))
        dt = self.rnd.choice(FLOATS + (("bf16",) if self.op.bf16 else ()))
        kind = "float"
        return Value(f"{dt}({a.text})", kind, a.exact and dt == "f64", min(a.mag, 60000.0))

    def reduce(self, depth: int) -> Value:
        self.nreduce += 1
        k = f"k{self.nreduce}"
        ext = self.op.extent()
        self.vars[k] = ext
        moving = constructs.moving_extent(self, k) if self.rnd.random() < 0.2 else None
        ext = self.vars[k]
        body = self.expr(depth - 1)
        del self.vars[k]
        if body.kind == "bool":
            body = Value(f"i32({body.text})", "int", True, 1.0)
        fn = self.rnd.choice(["sum", "sum", "max", "min", "prod"])
        extent = self.op.sizes.get(ext, None) or (int(ext) if ext.isdigit() else 64)
        explicit = not self.alone(k, body.text) or self.rnd.random() < 0.3
        axis = moving or (f"{k}: {ext}" if explicit else k)
        if fn == "prod":
            if body.kind == "float":
                body = Value(f"(1.0 + 0.05 * tanh({body.text}))", "float", False, 1.1)
            else:
                body = Value(f"(({body.text}) % 3 - 1)", "int", body.exact, 1.0)
            return Value(f"prod[{axis}]{_paren(body.text)}", body.kind, body.exact, 1.1 ** extent)
        mag = body.mag * extent if fn == "sum" else body.mag
        return self.bound(Value(f"{fn}[{axis}]{_paren(body.text)}", body.kind, body.exact, mag))


def _paren(text: str) -> str:
    return f"({text})"


def generate(seed: int, bf16: bool = False) -> Program:
    """One random program: a file of one to three ops and the values to call each at."""
    rnd = random.Random(seed)
    sizes = {s: rnd.choice(SIZES) for s in SYMBOLS}
    if rnd.random() < 0.03:
        sizes[rnd.choice(SYMBOLS)] = 0
    ops: list[str] = []
    cases: list[OpCase] = []
    for n in range(rnd.choice([1, 1, 1, 2, 3])):
        if rnd.random() < 0.2:
            text, binds = template(rnd, f"fz{n}", bf16)
            ops.append(text)
            cases.append(OpCase(f"fz{n}", binds))
            continue
        b = _OpBuilder(rnd, f"fz{n}", sizes, bf16)
        b.add_inputs()
        if rnd.random() < 0.15:
            constructs.make_generic(b)
        for _ in range(rnd.randint(0, 3)):
            if rnd.random() < 0.3:
                b.add_pad()
            b.add_statement()
        results = [b.add_statement(result=f"Y{r}") for r in range(rnd.choice([1, 1, 2]))]
        constructs.maybe_poison(b)
        ops.append(_format_op(b, results))
        cases.append(OpCase(b.name, {**{s: sizes[s] for s in b.syms}, **b.params}))
    return Program(seed, "\n\n".join(ops) + "\n", cases)


def _format_op(b: _OpBuilder, results: list[Tensor]) -> str:
    params = [f"{t.name}: {t.decl()}" for t in b.tensors if t.name in b.inputs]
    params += [f"{n}: {dt}" for n, dt in b.scalars]
    res = [f"{t.name}: {t.decl()}" for t in results]
    cparams = ([f"P = {b.rnd.choice([0, 1, 2])}"] if b.params else []) + \
        ([f"T: {b.generic[0]}"] if b.generic else [])
    head = f"[{', '.join(cparams)}]" if cparams else ""
    res_text = res[0] if len(res) == 1 else f"({', '.join(res)})"
    body = "\n    ".join(b.lines)
    return f"op {b.name}{head}({', '.join(params)}) -> {res_text} {{{b.ann.text()}\n    {body}\n}}"
