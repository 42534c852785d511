"""Compare CEL libraries on the selectors DRA uses (run on demand:
``python3 -m benchmarks.cel_compare``).

Libraries: ``cel-expr-python`` (module ``cel_expr_python``, Google's cel-cpp), the one
Muster uses through ``controller.fit.cel``; ``common-expression-language`` (module ``cel``,
Rust cel-interpreter bindings); ``cel-python`` (module ``celpy``, pure Python). A library
that is not installed is reported as such. Each is given the same Kubernetes quantity/semver
functions (``controller.fit.cel.library_functions``) and the same ``device`` variable, then
checked on every expression (expected value, or an error where Kubernetes reports one) and
timed: compile, and evaluation per device.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from controller.fit.cel import SemVer, device_value, library_functions

DEVICE = device_value(
    "gpu.nvidia.com",
    {
        "type": "gpu", "productName": "NVIDIA H100 80GB HBM3", "brand": "Nvidia",
        "architecture": "Hopper", "index": 3, "uuid": "GPU-0b1e4c8a-3",
        "driverVersion": SemVer.parse("550.54.15"),
        "cudaComputeCapability": SemVer.parse("9.0.0"),
        "resource.kubernetes.io/pcieRoot": "pci0000:10",
    },
    {"memory": 80 * 2**30},
    False,
)
ERROR = object()
CASES: list[tuple[str, object]] = [
    ('device.driver == "gpu.nvidia.com"', True),
    ('device.attributes["gpu.nvidia.com"].productName == "NVIDIA H100 80GB HBM3"', True),
    ('device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) >= 0', True),
    ('device.capacity["gpu.nvidia.com"].memory.isLessThan(quantity("40Gi"))', False),
    ('"productName" in device.attributes["gpu.nvidia.com"]', True),
    ('"x" in device.attributes["gpu.nvidia.com"]', False),
    ('device.driver == "gpu.nvidia.com" && device.attributes["gpu.nvidia.com"].index >= 2',
     True),
    ('device.attributes["gpu.nvidia.com"].architecture == "Ampere" || '
     'device.attributes["gpu.nvidia.com"].type == "gpu"', True),
    ('device.attributes["gpu.nvidia.com"].driverVersion.isGreaterThan(semver("1.2.0"))', True),
    ('device.attributes["gpu.nvidia.com"].cudaComputeCapability.compareTo(semver("8.0.0")) >= 0',
     True),
    ('device.attributes["resource.kubernetes.io"].pcieRoot == "pci0000:10"', True),
    ('device.driver == "nic.example.com" && device.attributes["nic.example.com"].speed > 100',
     False),
    ('device.attributes["gpu.nvidia.com"].productName.startsWith("NVIDIA H1")', True),
    ('device.allowMultipleAllocations == false', True),
    ('cel.bind(a, device.attributes["gpu.nvidia.com"], a.architecture == "Hopper")', True),
    ('device.attributes["gpu.nvidia.com"].missing == "x"', ERROR),
    ('device.capacity["gpu.nvidia.com"].memory > 5', ERROR),
    ('device.driver ==', ERROR),
]
TIMED = 'device.driver == "gpu.nvidia.com" && ' \
    'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) >= 0'

Compiled = Callable[[dict[str, Any]], object]


def _muster() -> Callable[[str], Compiled]:
    import controller.fit.cel as mc

    def compile_(expr: str) -> Compiled:
        mc._compile.cache_clear()  # time real compiles, not the cache
        mc._compile_text.cache_clear()
        sel = mc.compile_selector(expr, "bench")
        return sel.matches

    return compile_


def _rust() -> Callable[[str], Compiled]:
    import cel

    ctx = cel.Context()
    for name, (_member, _params, _ret, impl) in library_functions().items():
        ctx.add_function(name, impl)

    def compile_(expr: str) -> Compiled:
        program = cel.compile(expr)

        def run(device: dict[str, Any]) -> object:
            ctx.add_variable("device", device)
            return program.execute(ctx)

        return run

    return compile_


def _celpy() -> Callable[[str], Compiled]:
    import celpy
    from celpy import celtypes
    from celpy.adapter import json_to_cel

    def convert(fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            plain = [_plain(a) for a in args]
            return json_to_cel(fn(*plain))

        return call

    functions = {name: convert(impl) for name, (_, _, _, impl) in library_functions().items()}
    env = celpy.Environment()

    def _plain(v: Any) -> Any:
        if isinstance(v, celtypes.MapType):
            return {str(k): _plain(x) for k, x in v.items()}
        if isinstance(v, celtypes.BoolType):
            return bool(v)
        if isinstance(v, celtypes.IntType):
            return int(v)
        if isinstance(v, celtypes.StringType):
            return str(v)
        return v

    def compile_(expr: str) -> Compiled:
        program = env.program(env.compile(expr), functions=functions)

        def run(device: dict[str, Any]) -> object:
            return program.evaluate({"device": json_to_cel(device)})

        return run

    return compile_


LIBRARIES: list[tuple[str, Callable[[], Callable[[str], Compiled]]]] = [
    ("cel-expr-python (chosen)", _muster),
    ("common-expression-language", _rust),
    ("cel-python (celpy)", _celpy),
]


def _check(compile_: Callable[[str], Compiled]) -> tuple[int, list[str]]:
    ok = 0
    wrong: list[str] = []
    for expr, want in CASES:
        try:
            got: object = compile_(expr)(DEVICE)
            if type(got).__name__ == "CELEvalError":  # celpy returns errors as values
                got = ERROR
        except Exception:
            got = ERROR
        if got is want or (want is not ERROR and got is not ERROR and got == want):
            ok += 1
        else:
            shown = "error" if got is ERROR else repr(got)
            wrong.append(f"{expr}  ->  {shown}")
    return ok, wrong


def _time(compile_: Callable[[str], Compiled]) -> tuple[float, float]:
    compiles: list[float] = []
    for _ in range(50):
        t = time.perf_counter()
        compile_(TIMED)
        compiles.append((time.perf_counter() - t) * 1e6)
    run = compile_(TIMED)
    evals: list[float] = []
    for _ in range(20):
        t = time.perf_counter()
        for _ in range(200):
            run(DEVICE)
        evals.append((time.perf_counter() - t) * 1e6 / 200)
    return statistics.median(compiles), statistics.median(evals)


def main() -> None:
    print(f"{len(CASES)} DRA selector cases; timed expression: {TIMED}")
    print(f"{'library':<28} {'correct':>8} {'compile_us':>11} {'eval_us':>9}")
    for name, factory in LIBRARIES:
        try:
            compile_ = factory()
        except ImportError as exc:
            print(f"{name:<28} not installed ({exc.name})")
            continue
        ok, wrong = _check(compile_)
        comp, ev = _time(compile_)
        print(f"{name:<28} {ok:>5}/{len(CASES):<2} {comp:>11.1f} {ev:>9.1f}")
        for w in wrong:
            print(f"    wrong: {w}")


if __name__ == "__main__":
    main()
