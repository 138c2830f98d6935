"""Random multi-statement programs (row reductions, broadcasts, pads shifted along either dim,
cheap and expensive elementwise steps) through fusion, im2col-free lowering and the CPU
scheduler, against the reference interpreter, which never fuses."""

import numpy as np
from helpers import check_op
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

STEPS = st.sampled_from(["exp", "cheap", "rowsum", "rowmax", "bcast", "shift_c", "shift_n", "mix"])


def build(steps: list[str]) -> str:
    lines, mats, rows, pads = [], ["X"], [], 0

    def mat(k: int) -> str:
        return mats[-1 - (k % len(mats))]

    for i, step in enumerate(steps):
        a = mat(i)
        name = f"t{i}"
        lines.append(f"{name}: f32[N, C]")
        if step == "exp":
            lines.append(f"{name}[n, c] = exp({a}[n, c] * 0.1)")
        elif step == "cheap":
            lines.append(f"{name}[n, c] = {a}[n, c] * 0.5 + 1.0")
        elif step in ("rowsum", "rowmax"):
            op = "sum" if step == "rowsum" else "max"
            lines[-1] = f"r{i}: f32[N]"
            lines.append(f"r{i}[n] = {op}[c]({a}[n, c])")
            rows.append(f"r{i}")
            continue
        elif step == "bcast" and rows:
            lines.append(f"{name}[n, c] = {a}[n, c] - {rows[-1]}[n]")
        elif step == "bcast":
            lines.append(f"{name}[n, c] = -{a}[n, c]")
        elif step == "shift_c":
            pads += 1
            lines.append(f"p{pads} = pad({a}, [0, 1], [0, 1])")
            lines.append(f"{name}[n, c] = p{pads}[n, c] + p{pads}[n, c + 2]")
        elif step == "shift_n":
            pads += 1
            lines.append(f"p{pads} = pad({a}, [1, 0], [1, 0], value=-1.0)")
            lines.append(f"{name}[n, c] = p{pads}[n, c] * p{pads}[n + 2, c]")
        else:
            lines.append(f"{name}[n, c] = max({a}[n, c], {mat(i + 1)}[n, c])")
        mats.append(name)
    lines.append(f"Y[n, c] = {mats[-1]}[n, c]" + (f" + {rows[-1]}[n]" if rows else ""))
    body = "\n    ".join(lines)
    return f"op prog(X: f32[N, C]) -> Y: f32[N, C] {{\n    {body}\n}}"


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(STEPS, min_size=1, max_size=6), n=st.sampled_from([1, 3, 8]), c=st.sampled_from([1, 5, 33]))
def test_random_programs_match_reference(steps, n, c):
    check_op(build(steps), "prog", dict(N=n, C=c), np.random.default_rng())
